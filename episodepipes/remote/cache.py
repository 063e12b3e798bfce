"""A bounded local cache of fetched ranges or whole objects, shared by the processes (ranks) of one machine.

Each entry is one file named by a hash of (root, file name, identity, offset, size), or (root, file name, identity)
for a whole object (a shard, for training that reads it over many epochs). The identity is what the object's bytes
are known by (its sha256 from the index, or its size and ETag as the store reports them): a dataset re-uploaded
under the same root and names gets new keys, so its reads never hit the old one's entries, which age out as usual.
Entries are written to a temporary file and moved into place with `os.replace`, so a reader sees a whole entry or
none, and two processes filling the same entry both succeed (the last rename wins, with identical bytes). Eviction is
least-recently-used by size: a hit refreshes the entry's mtime, and when this process's view of the total
passes the bound it rescans the folder and deletes the oldest entries. The bound is approximate across
processes (each sees the others' writes at its next scan).

Filling is shared too: a process that misses an entry `claim`s it (an ``O_EXCL`` marker file beside it)
before fetching, and one that finds it claimed `wait`s for the entry instead of fetching the same bytes
(ranks of one machine reading the same blocks at the same time). A marker older than ``stale`` seconds
(its process died) is taken over; a wait gives up after ``stale`` seconds and the caller fetches.

An entry is served as a shard's bytes, so the folder must be this user's alone: it is made with mode 0700, and one
that another user owns (or links to from a link of theirs) or may write is refused by name before any entry is read.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import threading
import time
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger(__name__)
_SUFFIX = ".bin"
_TMP = ".tmp-"
_LOCK = ".lock"


class _TooBig(Exception):
    pass


class RangeCache:
    """Range and whole-object entries in ``folder``, at most about ``max_bytes`` in total.

    Every method takes the object's ``root``, ``name`` and ``ident`` (what its bytes are known by: a sha256 the
    index vouches for, or the store's ETag), so an object that changed never hits the entries of the old one.
    """

    def __init__(self, folder: str | os.PathLike, max_bytes: int, *, stale: float = 120.0) -> None:
        if type(max_bytes) is not int or max_bytes <= 0:
            raise ValueError(f"cache_bytes={max_bytes!r} should be a positive int (bytes)")
        self.folder = Path(folder)
        self.max_bytes = max_bytes
        self.stale = float(stale)
        self._lock = threading.Lock()
        self._total: int | None = None  # this process's view: last scan plus its own writes since
        self._since_scan = 0
        self._private = False  # the folder was checked to be this user's alone

    def check_private(self) -> None:
        """Make the folder (0700) if need be, and refuse one that another user owns, links to or may write: an
        entry planted there would be read as a shard's bytes, and a link would make us write and evict elsewhere."""
        if self._private:
            return
        try:
            self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            link, st = os.lstat(self.folder), os.stat(self.folder)
        except OSError:
            return  # no folder to read or write: every use of it fails and falls back to fetching, as before
        uid = os.geteuid()
        why = ("is a link owned by another user" if link.st_uid != uid else "is owned by another user"
               if st.st_uid != uid else "may be written by other users" if st.st_mode & 0o022 else None)
        if why:
            raise ValueError(f"cache_dir={str(self.folder)!r} {why}, who could plant entries read as shard bytes; "
                             "use a folder of your own that only you may write (chmod 700), e.g. ~/.cache/episodepipes")
        self._private = True

    def _path(self, root: str, name: str, ident: str, offset: int, size: int) -> Path:
        key = hashlib.sha256(f"{root}\n{name}\n{ident}\n{offset}\n{size}".encode()).hexdigest()[:40]
        return self.folder / f"{key}{_SUFFIX}"

    def get(self, root: str, name: str, ident: str, offset: int, size: int) -> bytes | None:
        """The cached bytes, or None on a miss (or an entry of the wrong size, which is dropped)."""
        self.check_private()
        path = self._path(root, name, ident, offset, size)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        if len(data) != size:
            log.warning("dropping cache entry %s: %d bytes, expected %d", path, len(data), size)
            path.unlink(missing_ok=True)
            return None
        try:
            os.utime(path)  # LRU: a hit makes the entry young again
        except FileNotFoundError:
            pass  # evicted by another process meanwhile; the bytes read are whole all the same
        return data

    def put(self, root: str, name: str, ident: str, offset: int, size: int, data: bytes) -> None:
        """Store ``data`` atomically, then evict if over the bound. Failures to cache are logged, not raised."""
        if len(data) == size <= self.max_bytes:
            self._commit(self._path(root, name, ident, offset, size), [data], name)

    def claim(self, root: str, name: str, ident: str, offset: int, size: int) -> bool:
        """Whether this process should fetch the entry: True when it made the entry's fill marker (or took over a
        stale one, or cannot make one), False while another process holds a live marker (then `wait`)."""
        self.check_private()
        lock = self._path(root, name, ident, offset, size).with_suffix(_LOCK)
        for _ in range(2):
            try:
                self.folder.mkdir(parents=True, exist_ok=True)
                os.close(os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
                return True
            except FileExistsError:
                try:
                    if time.time() - lock.stat().st_mtime < self.stale:
                        return False
                    lock.unlink()  # left by a process that died while fetching
                except FileNotFoundError:
                    pass  # released meanwhile: claim again
            except OSError:
                return True  # no marker possible here (read-only folder, ...): fetch, unshared
        return True

    def release(self, root: str, name: str, ident: str, offset: int, size: int) -> None:
        """Drop this process's fill marker of the entry (after `put`, or after the fetch failed)."""
        self._path(root, name, ident, offset, size).with_suffix(_LOCK).unlink(missing_ok=True)

    def wait(self, root: str, name: str, ident: str, offset: int, size: int) -> bytes | None:
        """The entry another process claimed, once it is there; None when its marker goes without the entry (the
        fetch failed) or after ``stale`` seconds: the caller then fetches the bytes itself."""
        lock = self._path(root, name, ident, offset, size).with_suffix(_LOCK)
        deadline, delay = time.monotonic() + self.stale, 0.002
        while True:
            data = self.get(root, name, ident, offset, size)
            if data is not None or not lock.exists() or time.monotonic() > deadline:
                return data if data is not None else self.get(root, name, ident, offset, size)
            time.sleep(delay)
            delay = min(2 * delay, 0.05)

    def read_whole(self, root: str, name: str, ident: str, ranges: list[tuple[int, int]]) -> list[bytes] | None:
        """``ranges`` of the cached whole object, or None if it is not cached. A short piece is left short."""
        self.check_private()
        path = self._path(root, name, ident, -1, -1)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            out = [os.pread(fd, n, off) for off, n in ranges]
        finally:
            os.close(fd)
        try:
            os.utime(path)
        except FileNotFoundError:
            pass
        return out

    def whole_path(self, root: str, name: str, ident: str) -> Path | None:
        """The file holding the cached whole object (for a caller that maps it), or None if it is not cached."""
        self.check_private()
        path = self._path(root, name, ident, -1, -1)
        try:
            os.utime(path)
        except FileNotFoundError:
            return None
        return path

    def wait_whole(self, root: str, name: str, ident: str) -> None:
        """Return once the whole object another process claimed is cached, its marker is gone (the fetch failed),
        or ``stale`` seconds passed: the caller then fetches it itself if it is still missing."""
        lock = self._path(root, name, ident, -1, -1).with_suffix(_LOCK)
        deadline, delay = time.monotonic() + self.stale, 0.002
        while self.whole_path(root, name, ident) is None and lock.exists() and time.monotonic() < deadline:
            time.sleep(delay)
            delay = min(2 * delay, 0.05)

    def put_whole(self, root: str, name: str, ident: str, chunks: Iterable[bytes]) -> bool:
        """Store a whole object streamed as ``chunks``; False if it could not be (too big, disk error)."""
        return self._commit(self._path(root, name, ident, -1, -1), chunks, name)

    def _commit(self, path: Path, chunks: Iterable[bytes], name: str) -> bool:
        self.check_private()
        size = 0
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=_TMP, dir=self.folder)
            try:
                with os.fdopen(fd, "wb") as f:
                    for c in chunks:
                        size += len(c)
                        if size > self.max_bytes:
                            raise _TooBig
                        f.write(c)
                os.replace(tmp, path)  # readers see the whole entry or none; the last of two writers wins
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except _TooBig:
            log.warning("%s is larger than cache_bytes=%d; not cached", name, self.max_bytes)
            return False
        except OSError as e:
            log.warning("could not cache %s in %s: %s", name, self.folder, e)
            return False
        with self._lock:
            if self._total is None:
                self._total = self._scan_total()
            else:
                self._total += size
            self._since_scan += size
            if self._total > self.max_bytes or self._since_scan > self.max_bytes // 8:
                self._evict()
        return True

    def _entries(self) -> list[tuple[float, int, Path]]:
        out = []
        for p in self.folder.glob(f"*{_SUFFIX}"):
            try:
                st = p.stat()
            except FileNotFoundError:
                continue
            out.append((st.st_mtime, st.st_size, p))
        return out

    def _scan_total(self) -> int:
        return sum(n for _, n, _ in self._entries())

    def _evict(self) -> None:
        stale = time.time() - 3600
        for p in [*self.folder.glob(f"{_TMP}*"), *self.folder.glob(f"*{_LOCK}")]:  # left by a killed process
            try:
                if p.stat().st_mtime < stale:
                    p.unlink()
            except FileNotFoundError:
                pass
        entries = sorted(self._entries(), key=lambda e: (e[0], e[2].name))
        total = sum(n for _, n, _ in entries)
        for _, n, p in entries:
            if total <= self.max_bytes:
                break
            p.unlink(missing_ok=True)
            total -= n
        self._total, self._since_scan = total, 0

    def __repr__(self) -> str:
        return f"RangeCache({str(self.folder)!r}, max_bytes={self.max_bytes})"
