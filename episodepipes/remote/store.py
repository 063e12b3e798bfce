"""Writing under a remote root: verified PUTs, listing and deleting, for `write` and `merge` to an object store.

Each PUT is atomic on an object store (a reader sees the whole object or none), which is what lets a
writer upload shards as they finish and the index last. A PUT is checked after the fact: the object's
size must be the file's, and where the store reports an S3-style ETag (the MD5 of a single-part upload,
or the MD5 of the parts' MD5s for a multipart one) it must be the file's too. Calls are retried like
reads (`episodepipes.remote.retry`); re-sending a whole object is safe, since it replaces itself.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import urlsplit

from ..errors import ShardIOError, ShardMissingError
from ..format import check_name
from .source import RemoteOptions, RemoteSource

WRITABLE = ("s3", "gs")
PART = 8 * 1024 * 1024  # multipart chunk: objects larger than this go up in parts of this size
_NO_BUCKET = re.compile(r"NoSuchBucket|bucket does not exist|status code: 404", re.I)
_ETAG = re.compile(r'"?([0-9a-f]{32})(?:-(\d+))?"?')


def check_path(path: str) -> str:
    """``path`` if every ``/``-separated part of it is a plain name (a listed object inside the root)."""
    for part in str(path).split("/"):
        check_name(part)
    return path


def file_digests(path: Path, part: int = PART) -> tuple[str, str, int]:
    """(sha256, the S3 ETag an upload of the file in ``part``-byte parts gets, size), in one read."""
    sha, parts, whole, size = hashlib.sha256(), [], hashlib.md5(), 0
    with open(path, "rb") as f:
        while chunk := f.read(part):
            sha.update(chunk)
            whole.update(chunk)
            parts.append(hashlib.md5(chunk).digest())
            size += len(chunk)
    if len(parts) <= 1:
        return sha.hexdigest(), whole.hexdigest(), size
    return sha.hexdigest(), f"{hashlib.md5(b''.join(parts)).hexdigest()}-{len(parts)}", size


class RemoteStore(RemoteSource):
    """A `RemoteSource` that also writes under its root (``s3://`` or ``gs://``)."""

    def __init__(self, root: str, options: RemoteOptions | None = None) -> None:
        super().__init__(root, options)
        scheme = self.root.split("://", 1)[0]
        if scheme not in WRITABLE:
            raise ValueError(f"OUT {self.root!r}: episodepipes writes to s3://bucket/prefix or gs://bucket/prefix "
                             f"only ({scheme}:// is read-only here); write locally and upload, or choose such a root")

    def put_file(self, name: str, path: Path, *, sha256: str | None = None) -> None:
        """Upload the local file ``path`` as ``name``, then check the object's size (and ETag where it is an MD5).

        ``sha256``, when given, is what the file should hash to (the writer's record): a local file that
        changed since it was written is refused before it is sent.
        """
        import obstore

        name = check_path(name)
        sha, etag, size = file_digests(path)
        if sha256 is not None and sha != sha256:
            raise ShardIOError(f"{path} no longer has the sha256 it was written with; it was changed on disk "
                               "after writing: re-run with --overwrite")
        self._call(name, None, lambda: obstore.put(self._client(), name, path, use_multipart=size > PART,
                                                   chunk_size=PART, max_concurrency=4))
        self._check(name, size, etag)

    def put_bytes(self, name: str, data: bytes) -> None:
        """Upload ``data`` as ``name`` (one PUT), then check the object as `put_file` does."""
        import obstore

        name = check_path(name)
        self._call(name, None, lambda: obstore.put(self._client(), name, data, use_multipart=False))
        self._check(name, len(data), hashlib.md5(data).hexdigest())

    def _check(self, name: str, size: int, etag: str) -> None:
        import obstore

        meta = self._call(name, None, lambda: obstore.head(self._client(), name))
        got = _ETAG.fullmatch(str(meta.get("e_tag") or ""))
        if int(meta["size"]) != size or (got is not None and got.group(0).strip('"') != etag):
            raise ShardIOError(f"{self.root}/{name}: the uploaded object ({meta['size']} bytes) does not match the "
                               f"local file ({size} bytes, MD5 {etag}); re-run to upload it again")
        self._forget(name)

    def names(self, prefix: str | None = None) -> list[str]:
        """Every object's path under the root (or under ``prefix/`` in it), relative to the root, sorted."""
        import obstore

        where = "list" if prefix is None else f"list {prefix}/"
        out: list[str] = []

        def listing() -> None:
            out.clear()
            for batch in obstore.list(self._client(), prefix=prefix):
                out.extend(str(o["path"]) for o in batch)

        try:
            self._call(where, None, listing)
        except ShardIOError as e:  # the first call a write makes: a missing bucket shows here, as a 404
            raise self._no_bucket(e) from None
        return sorted(out)

    def _no_bucket(self, e: ShardIOError) -> ShardIOError:
        """A listing's 404 (a prefix that holds nothing lists as empty) means the bucket itself does not exist:
        one line naming it and the fix, not the store's XML; any other failure is ``e`` as it was."""
        if not (isinstance(e, ShardMissingError) or _NO_BUCKET.search(str(e))):
            return e
        bucket = urlsplit(self.root).netloc
        scheme = self.root.split("://", 1)[0]
        make = f"aws s3 mb s3://{bucket}" if scheme == "s3" else f"gcloud storage buckets create gs://{bucket}"
        return ShardIOError(f"{self.root}: bucket {bucket!r} does not exist (the store answered 404 to a listing); "
                            f"create it ({make}) or fix OUT")

    def delete(self, paths: Iterable[str]) -> None:
        """Delete these objects (paths relative to the root, as `names` gives them); missing ones are no error."""
        import obstore

        paths = [check_path(p) for p in paths]
        if self.root.startswith("gs://"):  # GCS deletes one object per request, and answers 404 for a missing one
            def one(p: str) -> None:
                try:
                    obstore.delete(self._client(), p)
                except FileNotFoundError:
                    pass

            list(self._executor().map(lambda p: self._call(f"delete {p}", None, lambda: one(p)), paths))
        else:
            for i in range(0, len(paths), 1000):  # S3's DeleteObjects takes at most 1000 keys, ignores missing ones
                chunk = paths[i:i + 1000]
                self._call(f"delete {len(chunk)} objects", None, lambda c=chunk: obstore.delete(self._client(), c))
        for p in paths:
            self._forget(p)

    def __repr__(self) -> str:
        return f"RemoteStore({self.root!r})"
