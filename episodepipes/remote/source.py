"""The object-store byte source: ranged GETs through obstore, coalesced, concurrent, retried.

obstore (Rust's object_store) was chosen over fsspec/s3fs: on many concurrent 10-200 KB ranged GETs it
moved more bytes per second, it signs and copies in Rust with the GIL released (decode threads need it),
it is one wheel without transitive dependencies, and it speaks S3, GCS and HTTP behind one call. It
reads the standard environment (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ...) itself. Its own retries
are switched off: this module retries, so that the attempts are bounded by an option and the final error
names the object and the range.

The price: obstore's runtime is global and does not survive ``fork`` (a forked child of a process that
has read through it hangs on its first request). The pipes read in the main process and fork only decode
workers, which never touch a source; a forked child that tries gets a `ShardIOError` saying so, not a hang.
"""

from __future__ import annotations

import datetime
import importlib.util
import os
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import urlsplit

from ..errors import ShardIOError, ShardMissingError, ShardTooLargeError, ShardTruncatedError
from ..format import check_name
from . import retry
from .cache import RangeCache
from .ranges import Request, check_ranges, coalesce

SCHEMES = ("s3", "gs", "http", "https")
T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class RemoteOptions:
    """How a remote root is read. A local root ignores these.

    Args:
        gap: ranges at most this many bytes apart are fetched by one GET (the gap is read and dropped).
        waste: ... and only while a GET's dropped bytes stay within this fraction of its ranges' own, so
            every read costs at most ``1 + waste`` times its bytes (None: ``gap`` alone decides).
        max_request: a coalesced GET grows to at most this many bytes, so big plans still run in parallel.
        max_in_flight: GETs in flight at once per source.
        attempts: tries per GET on throttling (503/SlowDown), 5xx, timeouts and dropped connections.
        backoff: first retry delay in seconds; doubles per attempt (with jitter) up to ``max_backoff``.
        timeout: seconds for one GET, connection included.
        cache_dir: folder for a local range cache shared by the processes of one machine; None: no cache.
        cache_bytes: the cache's bound in bytes (least recently used entries are evicted past it).
        cache_whole: cache whole objects (one GET per shard, then local reads) instead of the ranges read; an
            index's per-frame columns are then fetched whole into the cache on first use and mapped from there.
        column_cache_bytes: bytes of an index's per-frame columns one process keeps in memory (blocks of rows read
            by range on use, the least recently used dropped past it; `episodepipes.remote.framecolumns`).
        allow_http: allow plain ``http://`` to any host (a root, ``AWS_ENDPOINT_URL`` or ``GOOGLE_BASE_URL``);
            without it only loopback hosts may be reached over plain HTTP, and other hosts are refused by name.
    """

    gap: int = 64 * 1024
    waste: float | None = 0.1
    max_request: int = 16 * 1024 * 1024
    max_in_flight: int = 16
    attempts: int = 5
    backoff: float = 0.05
    max_backoff: float = 2.0
    timeout: float = 30.0
    cache_dir: str | os.PathLike | None = None
    cache_bytes: int = 10 * 1024**3
    cache_whole: bool = False
    column_cache_bytes: int = 64 * 1024 * 1024
    allow_http: bool = False

    def __post_init__(self) -> None:
        for name, low in (("gap", 0), ("max_request", 1), ("max_in_flight", 1), ("attempts", 1),
                          ("cache_bytes", 1), ("column_cache_bytes", 1)):
            v = getattr(self, name)
            if type(v) is not int or v < low:
                raise ValueError(f"{name}={v!r} should be an int >= {low}")
        if self.waste is not None and (not isinstance(self.waste, int | float) or isinstance(self.waste, bool)
                                       or not 0 <= self.waste <= 1e6):
            raise ValueError(f"waste={self.waste!r} should be a fraction >= 0 (0.1: at most 1.1x the bytes), or None")
        for name, low in (("backoff", 0.0), ("max_backoff", 0.0), ("timeout", 1e-3)):
            v = getattr(self, name)
            if not isinstance(v, int | float) or isinstance(v, bool) or not low <= v < 1e6:
                raise ValueError(f"{name}={v!r} should be a number of seconds >= {low}")
        if type(self.allow_http) is not bool:
            raise ValueError(f"allow_http={self.allow_http!r} should be True or False")


def parse_root(root: str) -> str:
    """``root`` without a trailing slash, if it is a URL this source can open; a ValueError says why not."""
    parts = urlsplit(root)
    if "@" in parts.netloc or parts.query or parts.fragment:  # checked first: the root is not echoed then
        raise ValueError("a remote root may not carry credentials, a query or a fragment; "
                         "put credentials in the environment (AWS_ACCESS_KEY_ID, ...)")
    if parts.scheme not in SCHEMES or not parts.hostname:
        raise ValueError(f"root {root!r}: expected s3://bucket/prefix, gs://bucket/prefix or https://host/prefix")
    return root.rstrip("/")


def need_obstore(root: str) -> None:
    """Refuse a remote root by name when the ``remote`` extra is missing, before any read or write would meet a bare
    ``No module named 'obstore'``."""
    if importlib.util.find_spec("obstore") is None:
        raise ModuleNotFoundError(f"root {root!r} is remote and needs obstore, which is not installed: "
                                  "pip install 'episodepipes[remote]'", name="obstore")


class RemoteSource:
    """A `ByteSource` over ``s3://``, ``gs://`` or ``http(s)://`` objects under one root URL.

    Nothing is connected, resolved or requested until the first read, so a pipe that is never iterated
    (a closed gate) costs no request. Thread-safe; `close` drops the connections and the worker threads.
    """

    def __init__(self, root: str, options: RemoteOptions | None = None) -> None:
        self.root = parse_root(str(root))
        need_obstore(self.root)
        self.options = options or RemoteOptions()
        o = self.options
        stale = o.attempts * (o.timeout + o.max_backoff)  # the longest a fetch of one entry may take
        self._cache = RangeCache(o.cache_dir, o.cache_bytes, stale=stale) if o.cache_dir is not None else None
        self._lock = threading.Lock()
        self._store: object | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._sizes: dict[str, int] = {}
        self._pins: dict[str, str] = {}  # name -> the identity its cache entries are keyed by (`pin`)
        self._tags: dict[str, str] = {}  # name -> its size and ETag/version from a HEAD, for an object not pinned
        self._uncached: set[str] = set()  # objects that cache_whole could not store
        self._versions: dict[str, str] = {}  # name -> the ETag every GET of it requires (`probe`)
        self._fetching: dict[str, threading.Lock] = {}
        _LIVE.add(self)

    # -- ByteSource --------------------------------------------------------------------------------------
    def size(self, name: str) -> int:
        name = check_name(name)
        n = self._sizes.get(name)
        return self._head(name) if n is None else n

    def pin(self, digests: Mapping[str, str]) -> None:
        """Vouch for objects by the sha256 of their bytes (an index's shard list): the cache keys their entries by
        it, so a shard re-uploaded under the same name never serves the old one's cached bytes (and no HEAD asks
        for its ETag). Objects not pinned are known to the cache by their size and the ETag/version a HEAD reports."""
        self._pins.update({check_name(n): f"sha256:{d}" for n, d in digests.items()})

    def read(self, name: str, offset: int, size: int) -> bytes:
        return self.read_ranges(name, [(offset, size)])[0]

    def read_ranges(self, name: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        return self.read_many([(name, ranges)])[0]

    def read_many(self, calls: Sequence[tuple[str, Sequence[tuple[int, int]]]], *,
                  views: bool = False) -> list[list[bytes]]:
        """`read_ranges` of several objects at once: every object's coalesced GETs are in flight together.

        A training batch's frames lie in many shards; one call per shard would pay the latency once per
        shard, this pays it about once per batch (``max_in_flight`` bounds the GETs at a time). With a range
        cache, a range another process is fetching is waited for, not fetched again (`RangeCache.claim`).
        With ``views``, a range fetched here comes as a read-only memoryview of its GET's body instead of a
        copy, for a caller that slices it further (the view keeps the whole body alive while it lives).
        """
        return self._read_many(calls, share=True, views=views)

    def _read_many(self, calls: Sequence[tuple[str, Sequence[tuple[int, int]]]], *,
                   share: bool, views: bool = False) -> list[list[bytes]]:
        jobs: list[tuple[str, list[tuple[int, int]], list[bytes | None], list[int], RangeCache | None, str]] = []
        reqs: list[tuple[int, Request]] = []
        claims: list[tuple[str, str, tuple[int, int]]] = []  # entries this call fills for the processes sharing it
        waits: list[tuple[int, int]] = []  # (job, range) entries another process is filling
        calls = [(check_name(name), check_ranges(ranges)) for name, ranges in calls]
        idents = (self._identities([name for name, rs in calls if any(n for _, n in rs)]) if self._cache is not None
                  else {})
        wholes: dict[int, list[bytes] | None] = {}
        if self._cache is not None and self.options.cache_whole:  # whole objects fetched side by side too
            todo_whole = [k for k, (name, _) in enumerate(calls) if name not in self._uncached and idents.get(name)]
            cache = self._cache
            fetch = self._executor().map if len(todo_whole) > 1 else map
            for k, got in zip(todo_whole, fetch(lambda k: self._read_whole(cache, idents[calls[k][0]], *calls[k]),
                                                todo_whole)):
                wholes[k] = got
        for k, (name, ranges) in enumerate(calls):
            ident = idents.get(name, "")
            cache = self._cache if ident else None  # an object the store gives no identity for is not cached
            if cache is not None and self.options.cache_whole:
                whole = wholes.get(k)
                if whole is not None:
                    jobs.append((name, ranges, list(whole), [], None, ident))
                    continue
                self._uncached.add(name)  # too big for the cache, or no disk: read ranges, uncached
                cache = None
            out: list[bytes | None] = [b"" if n == 0 else None for _, n in ranges]
            if cache is not None:
                for i, (off, n) in enumerate(ranges):
                    if n:
                        out[i] = cache.get(self.root, name, ident, off, n)
            todo = [i for i, b in enumerate(out) if b is None]
            if cache is not None and share:
                mine = [cache.claim(self.root, name, ident, *ranges[i]) for i in todo]
                claims += [(name, ident, ranges[i]) for i, m in zip(todo, mine) if m]
                waits += [(len(jobs), i) for i, m in zip(todo, mine) if not m]
                todo = [i for i, m in zip(todo, mine) if m]
            o = self.options
            reqs += [(len(jobs), r) for r in coalesce([ranges[i] for i in todo], gap=o.gap, max_request=o.max_request,
                                                      waste=o.waste)]
            jobs.append((name, ranges, out, todo, cache, ident))
        try:
            self._fetch_into(jobs, reqs, views)
        finally:
            for name, ident, (off, n) in claims:
                self._cache.release(self.root, name, ident, off, n)  # type: ignore[union-attr]
        late: list[tuple[int, int]] = []
        for k, i in waits:
            name, ranges, out, _, cache, ident = jobs[k]
            out[i] = cache.wait(self.root, name, ident, *ranges[i])  # type: ignore[union-attr]
            if out[i] is None:
                late.append((k, i))
        if late:  # the other process failed or is stuck: fetch them here, unshared
            got = self._read_many([(jobs[k][0], [jobs[k][1][i]]) for k, i in late], share=False)
            for (k, i), [piece] in zip(late, got):
                jobs[k][2][i] = piece
        return [job[2] for job in jobs]  # type: ignore[misc]

    def _fetch_into(self, jobs: list, reqs: list[tuple[int, Request]], views: bool = False) -> None:
        """Run the coalesced GETs ``reqs`` and put each range's bytes (with ``views``, a view of the GET's body)
        into its job's output (and cache)."""
        if len(reqs) > 1:
            parts = list(self._executor().map(lambda jr: self._get(jobs[jr[0]][0], jr[1]), reqs))
        else:
            parts = [self._get(jobs[k][0], r) for k, r in reqs]  # one GET: no thread hop
        for (k, req), data in zip(reqs, parts):
            name, ranges, out, todo, cache, ident = jobs[k]
            view = memoryview(data)  # slices of the GET's buffer, copied once into each range's bytes (or not)
            self._check_body(name, req, len(view))
            for j in req.members:
                i = todo[j]
                off, n = ranges[i]
                piece = view[off - req.start: off - req.start + n]
                piece = piece if views else bytes(piece)
                if len(piece) != n:
                    raise self._short(name, off, off + n) from None
                out[i] = piece
                if cache is not None:
                    cache.put(self.root, name, ident, off, n, piece)

    def _read_whole(self, cache: RangeCache, ident: str, name: str,
                    ranges: list[tuple[int, int]]) -> list[bytes] | None:
        """``ranges`` from the cached whole object, fetching it first; None if it cannot be cached."""
        import obstore

        out = cache.read_whole(self.root, name, ident, ranges)
        if out is None:
            def fetch() -> bool:  # streamed in chunks; the version `probe` saw, if it fixed one
                etag = self._versions.get(name)
                opts = {"if_match": etag} if etag else None
                return cache.put_whole(self.root, name, ident, obstore.get(self._client(), name, options=opts))

            with self._lock:
                lock = self._fetching.setdefault(name, threading.Lock())
            with lock:  # threads of this process download a shard once; the others wait and read the entry
                out = cache.read_whole(self.root, name, ident, ranges)
                if out is None and (not self._call(name, None, fetch)
                                    or (out := cache.read_whole(self.root, name, ident, ranges)) is None):
                    return None
        for (off, n), piece in zip(ranges, out):
            if len(piece) != n:
                raise self._short(name, off, off + n) from None
        return out

    def probe(self, name: str, size: int) -> tuple[bytes, int]:
        """(the object's first ``size`` bytes, fewer if it is shorter; its whole size), from one ranged GET, which
        also fixes the version read: every later GET of the object asks for the ETag this one saw (If-Match), so
        an object replaced since is refused (`retry.Changed`, naming it) instead of read as a mix of two versions.

        What an index's column files are opened by: their header and size in one request, their rows by range later.
        """
        import obstore

        name = check_name(name)
        o = self.options

        def get() -> tuple[bytes, dict]:
            res = obstore.get(self._client(), name, options={"range": (0, max(size, 1))})
            return bytes(res.bytes()), res.meta

        try:
            data, meta = retry.call(get, where=f"{self.root}/{name} bytes 0-{size}", attempts=o.attempts,
                                    backoff=o.backoff, max_backoff=o.max_backoff)
        except retry.Missing:
            raise ShardMissingError(f"{self.root}/{name} is missing; upload it or re-shard {self.root}") from None
        except retry.NotSatisfiable:  # an empty object has no byte 0
            data, meta = b"", {"size": 0, "e_tag": None}
        total = int(meta["size"])
        if len(data) != min(total, max(size, 1)):
            raise ShardIOError(f"{self.root}/{name} bytes 0-{size}: the server sent {len(data)} bytes of this "
                               f"{total}-byte object; retry, or check the server and any proxy")
        self._sizes[name] = total
        if meta.get("e_tag") and not meta["e_tag"].startswith("W/"):  # a weak ETag never matches If-Match
            self._versions[name] = meta["e_tag"]
        return data[:size], total

    def local_copy(self, name: str) -> str | None:
        """The path of the whole object in the local cache, fetched into it first (once per machine: a process that
        finds another fetching it waits), for a caller that maps it; None without ``cache_dir`` and ``cache_whole``,
        or when it cannot be cached (larger than ``cache_bytes``, no disk)."""
        name = check_name(name)
        cache = self._cache
        if cache is None or not self.options.cache_whole or name in self._uncached:
            return None
        ident = self._identities([name]).get(name, "")
        if not ident:
            return None
        if cache.whole_path(self.root, name, ident) is None:
            mine = cache.claim(self.root, name, ident, -1, -1)
            try:
                if not mine:
                    cache.wait_whole(self.root, name, ident)
                if self._read_whole(cache, ident, name, []) is None:
                    self._uncached.add(name)
                    return None
            finally:
                if mine:
                    cache.release(self.root, name, ident, -1, -1)
        path = cache.whole_path(self.root, name, ident)
        return None if path is None else str(path)

    def __reduce__(self) -> tuple:
        # a source pickles as its root, options and what it knows of its objects (pins, versions, sizes): the copy
        # in another process opens its own connections on first use and asks for the same versions
        return RemoteSource, (self.root, self.options), {"pins": dict(self._pins), "versions": dict(self._versions),
                                                         "sizes": dict(self._sizes)}

    def __setstate__(self, state: dict) -> None:
        self._pins.update(state["pins"])
        self._versions.update(state["versions"])
        self._sizes.update(state["sizes"])

    def read_file(self, name: str, *, limit: int | None = None) -> bytes:
        """The whole object (an index), never cached: it is the file that says what the shards are.

        With ``limit``, the object's size is asked first (a HEAD) and one of more bytes is refused by it
        (`ShardTooLargeError`) before any is downloaded; then one ranged GET fetches exactly that many, so an object
        replaced in between cannot bring more.
        """
        import obstore

        name = check_name(name)
        if limit is None:
            res = self._call(name, None, lambda: bytes(obstore.get(self._client(), name).bytes()))
        else:
            self._forget(name)  # a fresh HEAD: the object may have changed since a size was cached
            size = self.size(name)
            if size > limit:
                raise ShardTooLargeError(f"{self.root}/{name}", size, limit, f"re-upload it or re-shard {self.root}")
            res = b"" if size == 0 else bytes(self._get(name, Request(0, size, ())))
            self._check_body(name, Request(0, size, ()), len(res))
        self._sizes[name] = len(res)
        return res

    def close(self) -> None:
        with self._lock:
            pool, self._pool, self._store = self._pool, None, None
            self._sizes, self._tags = {}, {}
        if pool is not None:
            pool.shutdown(wait=True)

    def __enter__(self) -> RemoteSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RemoteSource({self.root!r})"

    # -- internals -----------------------------------------------------------------------------------------
    def _client(self) -> object:
        store = self._store
        if store is None:
            global _STARTED_IN
            with self._lock:
                store = self._store
                if store is None:
                    from obstore.store import from_url

                    from .endpoint import allow_http, gcs_config

                    if _STARTED_IN not in (None, os.getpid()):
                        raise ShardIOError(
                            f"{self.root}: this process was forked from one that had already read a remote root "
                            "(obstore's runtime does not survive fork, it would hang); read remote roots in the "
                            "parent only, or start workers with the 'spawn' or 'forkserver' method")
                    _STARTED_IN = os.getpid()

                    t = datetime.timedelta(seconds=self.options.timeout)
                    plain = {"allow_http": True} if allow_http(self.root, self.options.allow_http) else {}
                    store = self._store = from_url(
                        self.root, config=gcs_config(self.root) or None,
                        client_options={**plain, "timeout": t, "connect_timeout": t},
                        retry_config={"max_retries": 0, "retry_timeout": t,
                                      "init_backoff": datetime.timedelta(0), "max_backoff": datetime.timedelta(0),
                                      "base": 2.0})
        return store

    def _head(self, name: str) -> int:
        """The object's size, from a HEAD that also records its identity for the cache (`pin` for why)."""
        import obstore

        meta = self._call(name, None, lambda: obstore.head(self._client(), name))
        n = self._sizes[name] = int(meta["size"])
        tag, version, modified = meta.get("e_tag"), meta.get("version"), meta.get("last_modified")
        self._tags[name] = (f"size={n} etag={tag} version={version}" if tag or version
                            else f"size={n} modified={modified.isoformat()}" if modified else "")
        return n

    def _identities(self, names: list[str]) -> dict[str, str]:
        """Each object's cache identity: its pinned sha256, else its HEAD's size and ETag ("" if the store reports
        neither an ETag, a version nor a modification time: such an object is not cached)."""
        self._cache.check_private()  # type: ignore[union-attr]  # a folder others may fill is refused before any request
        heads = sorted({n for n in names if n not in self._pins and n not in self._tags})
        list((self._executor().map if len(heads) > 1 else map)(self._head, heads))
        return {n: self._pins.get(n) or self._tags[n] for n in names}

    def _forget(self, name: str) -> None:
        """Drop what a HEAD said of the object (its size and ETag): it was written or deleted meanwhile."""
        self._sizes.pop(name, None)
        self._tags.pop(name, None)

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.options.max_in_flight, thread_name_prefix="episodepipes-get")
            return self._pool

    def _get(self, name: str, req: Request) -> object:
        import obstore

        etag = self._versions.get(name)
        if etag is None:
            return self._call(name, (req.start, req.end),
                              lambda: obstore.get_range(self._client(), name, start=req.start, end=req.end))
        return self._call(name, (req.start, req.end), lambda: obstore.get(
            self._client(), name, options={"range": (req.start, req.end), "if_match": etag}).bytes())

    def _call(self, name: str, span: tuple[int, int] | None, fn: Callable[[], T]) -> T:
        o = self.options
        where = f"{self.root}/{name}" + (f" bytes {span[0]}-{span[1]}" if span else "")
        try:
            return retry.call(fn, where=where, attempts=o.attempts, backoff=o.backoff, max_backoff=o.max_backoff)
        except retry.Missing:
            raise ShardMissingError(f"{self.root}/{name} is missing; upload it or re-shard {self.root}") from None
        except retry.NotSatisfiable:
            raise self._short(name, *span) from None  # type: ignore[misc]
        except retry.Changed:
            raise retry.Changed(f"{where}: the object changed since it was opened (its ETag is not the one read "
                                "then); reopen the index, or restore what was replaced") from None

    def _check_body(self, name: str, req: Request, got: int) -> None:
        """Refuse a ranged GET's body that is not the range asked for (obstore passes on what a server sends)."""
        if got != req.end - req.start:
            raise ShardIOError(f"{self.root}/{name} bytes {req.start}-{req.end}: the server sent {got} bytes for "
                               f"this {req.end - req.start}-byte range; retry, or check the server and any proxy")

    def _short(self, name: str, offset: int, end: int) -> ShardTruncatedError:
        try:
            have = f"ends at byte {self.size(name)}"
        except ShardIOError:
            have = "is shorter than that"
        return ShardTruncatedError(f"{self.root}/{name} {have}, the index expects {end}: truncated? "
                                   f"re-upload or re-shard it")


_LIVE: weakref.WeakSet[RemoteSource] = weakref.WeakSet()
_STARTED_IN: int | None = None  # the pid whose obstore runtime is running (one global runtime per process)


_INHERITED: list[object] = []  # in a forked child: the parent's store and pool, kept so their destructors never run


def _after_fork() -> None:
    # A forked worker inherits neither the worker threads nor usable connections: start afresh on demand.
    # The inherited objects are kept alive, not dropped: dropping the obstore store would run Rust destructors
    # against a runtime whose threads did not survive the fork (a lock held by one of them at fork time
    # would never be released), which can hang the child.
    for src in list(_LIVE):
        src._lock = threading.Lock()
        _INHERITED.append((src._store, src._pool))
        src._store, src._pool = None, None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)
