"""A local file's bytes, hashed in chunks or memory-mapped: how the index, verify, upgrade and recompute read whole
shards and columns without holding a copy of them; and the atomic writes of the index and its side files.
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
from collections.abc import Iterator
from pathlib import Path


def sha256_file(path: Path) -> str:
    """The hex sha256 of a file, read in 4 MiB chunks (a shard need not fit in memory)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


@contextlib.contextmanager
def mapped(path: Path) -> Iterator[memoryview]:
    """A file's bytes, memory-mapped: sha256 and per-frame crc32 slices read it once, without copies."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            yield memoryview(b"")
            return
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm, memoryview(mm) as view:
            yield view


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """`atomic_write_files` of one file."""
    atomic_write_files([(path, data)])


def atomic_write_files(files: list[tuple[Path, bytes]]) -> None:
    """Write each file to ``<name>.tmp``, fsync them all, then give each its name, in order: every file is durable
    before any is renamed, so the last one (an index) never names files that a crash could lose. The data of
    all of them is written before the first fsync, so the disk flushes them together."""
    tmps = [path.with_name(path.name + ".tmp") for path, _ in files]
    opened = []
    try:
        for tmp, (_, data) in zip(tmps, files):
            opened.append(open(tmp, "wb"))
            opened[-1].write(data)
            opened[-1].flush()
        for f in opened:
            os.fsync(f.fileno())
    finally:
        for f in opened:
            f.close()
    for tmp, (path, _) in zip(tmps, files):
        os.replace(tmp, path)
