"""A local file's bytes, hashed in chunks or memory-mapped: how the index, verify, upgrade and recompute read whole
shards and columns without holding a copy of them (writes go through `episodepipes.safefile`).
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

