"""A remote OUT (``s3://bucket/prefix``, ``gs://...``) for `write` and `merge`: local staging, uploads, index last.

The local writer runs unchanged in a *staging* folder (``--staging DIR``, by default under the user's
cache, ``~/.cache/episodepipes/staging``), one subfolder per OUT. Each shard is uploaded as soon as it is
finished, checked (size, and the ETag's MD5 on S3), then the progress file ``_progress.json`` is uploaded
beside it and the local shard deleted: local disk holds about one shard (plus the encoders' spool), and
the remote progress file is what a resume reads, on this machine or another, with any staging folder.
At the end the index's columns go up, then ``index.json`` last, and the remote progress is deleted. Each
PUT is atomic, so a reader never sees an index before every shard it names, nor a torn object.

One writer per OUT is assumed across machines (the lock is the staging folder's, on this machine only).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from pathlib import Path

from episodepipes import safefile
from episodepipes.format import INDEX_NAME
from episodepipes.index.load import MAX_INDEX_BYTES
from episodepipes.normstats.sidefile import NAME as STATS_NAME
from episodepipes.remote.source import parse_root
from episodepipes.remote.store import RemoteStore
from episodepipes.sharding.write.progress import JOBS_DIR, PROGRESS_NAME, STATS_LOG, clear
from episodepipes.shardio import ShardMissingError

log = logging.getLogger(__name__)
_SHARD = re.compile(r"shard-[0-9]{6}\.tar")  # ASCII digits, as the writer names them (\d takes any)
_WRITTEN = re.compile(r"(index\.json|index\.[a-z0-9]+\.npy|index\.stats\.bin|_progress\.json|_progress\.stats\.log|"
                      r"shard-\d{6}\.tar)")


def default_staging() -> Path:
    """``$XDG_CACHE_HOME/episodepipes/staging``, or ``~/.cache/episodepipes/staging``: where remote writes stage."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "episodepipes" / "staging"


class RemoteOut:
    """The remote root ``url`` and the local staging folder its writer works in.

    Args:
        url: the OUT, ``s3://bucket/prefix`` or ``gs://bucket/prefix``.
        staging: the folder for staging folders (one per OUT, named by a hash of ``url``); None:
            `default_staging`.
    """

    def __init__(self, url: str, staging: str | os.PathLike | None = None) -> None:
        self.url = parse_root(str(url))
        RemoteStore(self.url)  # refuses a root episodepipes cannot write to, before any work
        key = hashlib.sha256(self.url.encode()).hexdigest()[:16]
        self.staging = Path(staging if staging is not None else default_staging()) / key
        self._stores: dict[Path, RemoteStore] = {}

    def target_url(self, target: Path) -> str:
        """The URL a folder of the staging area stands for (a job's ``_jobs/job-NNNN`` too)."""
        rel = target.relative_to(self.staging).as_posix()
        return self.url if rel == "." else f"{self.url}/{rel}"

    def store(self, target: Path) -> RemoteStore:
        if target not in self._stores:
            self._stores[target] = RemoteStore(self.target_url(target))
        return self._stores[target]

    # -- write ---------------------------------------------------------------------------------------------
    def prepare(self, target: Path, state: dict, *, overwrite: bool, job: bool) -> bool:
        """Bring the remote state of ``target`` into its (cleared) staging folder; True if a write resumes.

        Refuses a finished output (``index.json`` there, or at the top for a job) unless ``overwrite``,
        which deletes what a write puts there first. A remote progress file is downloaded and its options
        checked; a remote folder with shards but neither index nor progress is refused.
        """
        store = self.store(target)
        names = store.names()
        top = self.store(self.staging) if job else None
        done = [s for s in (store, top) if s is not None and _exists(s, INDEX_NAME)]
        if done and not overwrite:
            raise FileExistsError(f"{done[0].root}/{INDEX_NAME} exists: the output is finished; pass --overwrite "
                                  "to replace it, or choose another OUT")
        clear_staging(target)  # the staging folder is a cache of the remote state, never the truth
        if overwrite:
            store.delete(written(names, jobs=not job))
            if top is not None and done:
                top.delete(written(top.names(), jobs=False))
            names = []
        if PROGRESS_NAME in names:
            raw = store.read_file(PROGRESS_NAME, limit=MAX_INDEX_BYTES)  # refused by size first
            try:
                options = json.loads(raw)["options"]
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"{store.root}/{PROGRESS_NAME} is damaged ({e}); pass --overwrite to start "
                                 "over") from None
            if options != state:
                changed = sorted(k for k in state.keys() | (options.keys() if isinstance(options, dict) else ())
                                 if state.get(k) != (options.get(k) if isinstance(options, dict) else None))
                raise ValueError(f"{store.root} holds an unfinished write with other options (differ: "
                                 f"{', '.join(changed)}); re-run with the same options to resume, or pass "
                                 "--overwrite to start over")
            if STATS_LOG in names:  # the finished episodes' statistics, which the progress lists by sha256
                safefile.write_file(target / STATS_LOG, store.read_file(STATS_LOG, limit=MAX_INDEX_BYTES))
            safefile.write_file(target / PROGRESS_NAME, raw)
            return True
        if any(_SHARD.fullmatch(n) for n in names):
            raise ValueError(f"{store.root} holds shards but no {INDEX_NAME} or {PROGRESS_NAME}, so it is not a "
                             "resumable write; pass --overwrite or choose an empty OUT")
        return False

    def check(self, target: Path):  # noqa: ANN201 - the `progress.start` check of the finished shards
        store = self.store(target)

        def check(shards: list[dict]) -> None:
            for s in shards:
                try:
                    ok = store.size(s["name"]) == s["bytes"]
                except ShardMissingError:
                    ok = False
                if not ok:
                    raise ValueError(f"{store.root}/{s['name']}, finished before the interruption, is missing or "
                                     "changed; pass --overwrite to start over")

        return check

    def save(self, target: Path) -> None:
        """Upload the staging folder's progress file (after each shard, and once at the start)."""
        store = self.store(target)
        if (target / STATS_LOG).exists():  # before the progress that lists its records
            store.put_file(STATS_LOG, target / STATS_LOG)
        store.put_bytes(PROGRESS_NAME, (target / PROGRESS_NAME).read_bytes())

    def shard_done(self, target: Path, shard: dict, *, progress: bool = True) -> None:
        """Upload a finished shard, checked against its record, then the progress; then drop the local copy."""
        path = target / shard["name"]
        self.store(target).put_file(shard["name"], path, sha256=shard["sha256"])
        if progress:
            self.save(target)
        path.unlink()
        log.info("uploaded %s/%s (%d bytes)", self.store(target).root, shard["name"], shard["bytes"])

    def finish(self, target: Path) -> bytes:
        """Upload the index written in the staging folder, columns first and ``index.json`` last; clean up.

        Returns the ``index.json`` bytes.
        """
        store = self.store(target)
        for p in [*sorted(target.glob("index.*.npy")), target / STATS_NAME]:
            if p.exists():  # a write without arrays has no statistics side file
                store.put_file(p.name, p)
        raw = (target / INDEX_NAME).read_bytes()
        store.put_bytes(INDEX_NAME, raw)  # the last PUT: from here on the output is finished
        store.delete([PROGRESS_NAME, STATS_LOG])
        clear_staging(target)
        return raw


def clear_staging(target: Path) -> None:
    """Remove what a write leaves in a staging folder (the index's columns too); its job folders stay."""
    clear(target, jobs=False)
    for p in target.glob("index.*.npy*"):
        p.unlink()


def written(names: list[str], *, jobs: bool) -> list[str]:
    """The objects among ``names`` that a write puts under a root (its job outputs too with ``jobs``)."""
    return [n for n in names if _WRITTEN.fullmatch(n) or (jobs and n.startswith(f"{JOBS_DIR}/"))]


def _exists(store: RemoteStore, name: str) -> bool:
    try:
        store.size(name)
    except ShardMissingError:
        return False
    return True
