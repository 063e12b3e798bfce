"""A file of a ``--codec reference`` index deflated in blocks, read back by byte range (the literal file).

The literal bytes (tar headers, pack tables, record heads, padding) are most of an in-place index's bytes, and
deflate about fourfold: their records' heads differ only in a few numbers. Deflated whole they would have to be
inflated whole to read one record's; so the file is cut into blocks of `BLOCK` bytes, each deflated on its own, and
a read inflates the blocks its range touches (kept in a small cache: a window's records share theirs).

Layout: `MAGIC`, ``<u4`` the block's bytes, ``<u8`` the bytes in all, then ``<u8`` each block's end in the deflated
data after the table (block k is ``[ends[k-1], ends[k])``), then the blocks. Reading checks the table against the
sizes the index gives before using it, and each block inflates to exactly its bytes (zlib's adler32 checked), or is
refused by name.
"""

from __future__ import annotations

import struct
import threading
import zlib
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

MAGIC = b"EPBLK1\n\0"
BLOCK = 1 << 14  # bytes of one block: a record's literal bytes inflate with at most this much beside them
CACHE = 64  # blocks kept inflated
_HEAD = struct.Struct("<IQ")


def encode(raw: bytes | memoryview, block: int = BLOCK) -> bytes:
    """The file's bytes for ``raw``."""
    view = memoryview(raw)
    parts = [zlib.compress(view[a:a + block], 6) for a in range(0, len(view), block)]
    ends = np.cumsum([len(p) for p in parts], dtype=np.int64).astype("<u8")
    return b"".join([MAGIC, _HEAD.pack(block, len(view)), ends.tobytes(), *parts])


def inflated(raw: bytes | memoryview, magic: bytes, nbytes: int, what: str, expect: str) -> bytes:
    """The ``nbytes`` that ``raw`` (``magic``, then one deflate stream, nothing after it) inflates to, never more
    held in memory; ValueError naming ``what`` when it is not that (``expect``: what it does not do then, after
    "does not")."""
    if bytes(raw[:len(magic)]) != magic:
        raise ValueError(f"{what} does not start with its magic")
    inflate = zlib.decompressobj()
    try:
        body = inflate.decompress(memoryview(raw)[len(magic):], nbytes + 1)
    except zlib.error as e:
        raise ValueError(f"{what} does not inflate ({e})") from None
    if len(body) != nbytes or not inflate.eof or inflate.unused_data:
        raise ValueError(f"{what} does not {expect}")
    return body


def table_bytes(total: int, block: int = BLOCK) -> int:
    """Bytes of the magic, head and table before the blocks of a file of ``total`` bytes."""
    return len(MAGIC) + _HEAD.size + 8 * -(-total // block)


class BlockFile:
    """Byte ranges of the inflated file ``name`` of ``folder`` (a byte source), as a byte source serves them.

    Args:
        folder: the index folder's byte source.
        name: the file's name in it.
        total: the inflated bytes the index says the file holds (the table is checked against it).
        error: the exception a damaged file raises (naming it and the fix).
    """

    def __init__(self, folder: Any, name: str, total: int, error: type[Exception], fix: str) -> None:
        self.folder, self.name, self.total, self._error, self._fix = folder, name, total, error, fix
        size = folder.size(name)
        head = folder.read(name, 0, min(size, len(MAGIC) + _HEAD.size))
        if len(head) != len(MAGIC) + _HEAD.size or head[:len(MAGIC)] != MAGIC:
            raise self._fail("does not start with its magic")
        block, got = _HEAD.unpack_from(head, len(MAGIC))
        if not 512 <= block <= 1 << 24 or got != total:
            raise self._fail(f"says {got} bytes in blocks of {block}, the index {total} (blocks of 512..16 MiB)")
        count = -(-total // block)
        start = table_bytes(total, block)
        if start > size:
            raise self._fail(f"holds {size} bytes, less than its table of {count} blocks")
        ends = np.frombuffer(folder.read(name, len(MAGIC) + _HEAD.size, 8 * count), "<u8").astype(np.int64) \
            if count else np.zeros(0, np.int64)
        if len(ends) != count or (count and (ends[-1] != size - start or (np.diff(np.r_[0, ends]) <= 0).any())):
            raise self._fail(f"its table of {count} blocks does not tile its {size - start} deflated bytes")
        self.block, self._start, self._bounds = block, start, np.r_[0, ends] + start
        self._cache: OrderedDict[int, bytes] = OrderedDict()
        self._lock = threading.Lock()

    def _fail(self, why: str) -> Exception:
        return self._error(f"{self.name} {why}; {self._fix}")

    def _blocks(self, a: int, b: int) -> list[bytes]:
        """Blocks ``a .. b - 1`` inflated (from the cache, or read together and inflated)."""
        with self._lock:
            have = {k: self._cache[k] for k in range(a, b) if k in self._cache}
            for k in have:
                self._cache.move_to_end(k)
        todo = [k for k in range(a, b) if k not in have]
        if todo:
            lo, hi = int(self._bounds[todo[0]]), int(self._bounds[todo[-1] + 1])
            data = memoryview(self.folder.read(self.name, lo, hi - lo))
            for k in todo:
                want = min(self.block, self.total - k * self.block)
                try:
                    have[k] = inflated(data[int(self._bounds[k]) - lo:int(self._bounds[k + 1]) - lo], b"", want,
                                       f"block {k}", f"inflate to its {want} bytes")
                except ValueError as e:
                    raise self._fail(str(e)) from None
            with self._lock:
                for k in todo:
                    self._cache[k] = have[k]
                while len(self._cache) > CACHE:
                    self._cache.popitem(last=False)
        return [have[k] for k in range(a, b)]

    def size(self, name: str) -> int:
        return self.total

    def read(self, name: str, offset: int, size: int) -> bytes:
        if offset < 0 or size < 0 or offset + size > self.total:
            raise self._error(f"{self.name}: bytes {offset}..{offset + size} lie past its {self.total} bytes")
        if not size:
            return b""
        a, b = offset // self.block, -(-(offset + size) // self.block)
        blocks = self._blocks(a, b)
        cut = offset - a * self.block
        if len(blocks) == 1:
            return blocks[0][cut:cut + size]
        return b"".join(blocks)[cut:cut + size]

    def read_ranges(self, name: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        return [self.read(name, off, size) for off, size in ranges]


__all__ = ["BLOCK", "BlockFile", "encode", "inflated", "table_bytes"]
