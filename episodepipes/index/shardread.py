"""A local shard read back whole by the commands (``verify``, ``upgrade --crc``, ``stats --recompute``): in chunks
into one reused buffer, or a checked range at a time, never memory-mapped.

Why not a mapping (what `episodepipes.filebytes.mapped` gives): a shard cut short in place while it is read (``cp``
over it, ``rsync --inplace``, a truncate) turns the next touch of a mapped page past the new end into SIGBUS, which
kills the process inside C code (sha256, zlib) with no message. A read that comes back short is `ShardTruncatedError`
naming the file instead. Reading costs a copy from the page cache, which a sequential ``readinto`` of large chunks
pays about what the mapping's page faults cost.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

from episodepipes.errors import ShardIOError
from episodepipes.shardio import open_regular, pread_exact, truncated

CHUNK = 4 << 20  # bytes per read of a whole-file scan (`chunks`), into one reused buffer


def _open(path: Path) -> io.FileIO:
    """``path`` for reading, if it is a regular file (a FIFO in its place would wait for a writer forever)."""
    fd, _ = open_regular(path, "restore it or re-shard", ShardIOError)
    return io.FileIO(fd, "rb", closefd=True)


def chunks(path: Path, size: int) -> Iterator[memoryview]:
    """The first ``size`` bytes of ``path`` in order, as views of one reused `CHUNK`-byte buffer (each valid until
    the next is asked for); `ShardTruncatedError` naming the file where it ends before ``size``."""
    buf = memoryview(bytearray(min(CHUNK, size)))
    with _open(path) as f:
        pos = 0
        while pos < size:
            want = buf[:min(len(buf), size - pos)]
            got = 0
            while got < len(want):
                n = f.readinto(want[got:])
                if not n:
                    raise truncated(path, pos + got, size)
                got += n
            pos += got
            yield want


@contextlib.contextmanager
def ranges(path: Path) -> Iterator[Callable[[int, int], bytes]]:
    """``pread(size, offset)``: ``size`` bytes of ``path`` at ``offset`` (the call shape `frame_fields` takes), read
    from one descriptor; `ShardTruncatedError` naming the file where it has fewer."""
    with _open(path) as f:
        fd = f.fileno()

        yield lambda size, offset: pread_exact(fd, size, offset, path)


def digest(parts: Iterable[memoryview | bytes], ranges: Sequence[tuple[int, int]]) -> tuple[str, list[int]]:
    """(hex sha256 of the concatenated ``parts``, crc32 of each (offset, size) range of them), in one pass: a range
    may span parts (its crc32 continues across them); bytes of a range past the end are not counted."""
    order = sorted(range(len(ranges)), key=lambda k: ranges[k][0])
    crcs = [0] * len(ranges)
    h = hashlib.sha256()
    nxt, active, pos = 0, [], 0
    for part in parts:
        end = pos + len(part)
        h.update(part)
        while nxt < len(order) and ranges[order[nxt]][0] < end:
            active.append(order[nxt])
            nxt += 1
        keep = []
        for k in active:
            a, b = ranges[k][0], ranges[k][0] + ranges[k][1]
            if b > pos:
                crcs[k] = zlib.crc32(part[max(a, pos) - pos:min(b, end) - pos], crcs[k])
            if b > end:
                keep.append(k)
        active = keep
        pos = end
    return h.hexdigest(), crcs
