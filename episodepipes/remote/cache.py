"""A bounded local cache of fetched ranges, shared by the processes (ranks, workers) of one machine.

Each entry is one file named by a hash of (root, file name, offset, size). Entries are written to a
temporary file and moved into place with `os.replace`, so a reader sees a whole entry or none, and two
processes filling the same entry both succeed (the last rename wins, with identical bytes). Eviction is
least-recently-used by size: a hit refreshes the entry's mtime, and when this process's view of the total
passes the bound it rescans the folder and deletes the oldest entries. The bound is approximate across
processes (each sees the others' writes at its next scan). Objects under a root are assumed immutable.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import threading
from pathlib import Path

log = logging.getLogger(__name__)
_SUFFIX = ".bin"
_TMP = ".tmp-"


class RangeCache:
    """Whole-range entries in ``folder``, at most about ``max_bytes`` in total."""

    def __init__(self, folder: str | os.PathLike, max_bytes: int) -> None:
        if type(max_bytes) is not int or max_bytes <= 0:
            raise ValueError(f"cache_bytes={max_bytes!r} should be a positive int (bytes)")
        self.folder = Path(folder)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._total: int | None = None  # this process's view: last scan plus its own writes since
        self._since_scan = 0

    def _path(self, root: str, name: str, offset: int, size: int) -> Path:
        key = hashlib.sha256(f"{root}\n{name}\n{offset}\n{size}".encode()).hexdigest()[:40]
        return self.folder / f"{key}{_SUFFIX}"

    def get(self, root: str, name: str, offset: int, size: int) -> bytes | None:
        """The cached bytes, or None on a miss (or an entry of the wrong size, which is dropped)."""
        path = self._path(root, name, offset, size)
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

    def put(self, root: str, name: str, offset: int, size: int, data: bytes) -> None:
        """Store ``data`` atomically, then evict if over the bound. Failures to cache are logged, not raised."""
        if len(data) != size or size > self.max_bytes:
            return
        path = self._path(root, name, offset, size)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=_TMP, dir=self.folder)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                os.replace(tmp, path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except OSError as e:
            log.warning("could not cache a range of %s in %s: %s", name, self.folder, e)
            return
        with self._lock:
            if self._total is None:
                self._total = self._scan_total()
            else:
                self._total += size
            self._since_scan += size
            if self._total > self.max_bytes or self._since_scan > self.max_bytes // 8:
                self._evict()

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
