"""Where each value of a parquet byte-array column lies in the file's own bytes: a list of byte ranges per row.

An image feature of a LeRobot dataset is a parquet column of PNG or JPEG bytes. A ``--codec reference`` index points
at those bytes where they lie: possible where the page stores them as they are. An UNCOMPRESSED page holds them
verbatim; a SNAPPY page holds a run of literals (PNG and JPEG do not compress, so snappy stores them as literal
runs) and, rarely, short copies of bytes earlier in the page (a header shared with the image before), which resolve
to the literal bytes they copy. So a value is a few pieces of the file; more than `MAX_PIECES` (bytes that really
compress) are refused. PLAIN values, and dictionary pages with their RLE-coded indices, are read; any other codec,
encoding or page kind is refused by name (`ParquetPagesError`), as is every count, length or offset that does not
fit the page (the file is a stranger's). Which column chunks to read comes from the caller (the file's footer, as
pyarrow reads it).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

MAX_PIECES = 64  # pieces one value may take (literal runs and resolved copies)
MAX_DEPTH = 8  # thrift structs nested in a page header
_PLAIN, _PLAIN_DICT, _RLE, _RLE_DICT = 0, 2, 3, 8
_DATA, _DICT, _DATA2 = 0, 2, 3


class ParquetPagesError(ValueError):
    """The column's pages cannot be pointed at (codec, encoding, page kind) or do not parse."""


@dataclass(frozen=True)
class Chunk:
    """One column chunk, from the footer: its first byte (dictionary page or first data page) and its bytes, its
    codec name as pyarrow gives it, its value count, and the column's maximum definition level (0: required)."""

    start: int
    size: int
    codec: str
    values: int
    max_def: int


@dataclass
class Values:
    """Per row: ``first[r]:first[r + 1]`` its pieces (``at``, ``size`` in the file), none for a null."""

    first: np.ndarray
    at: np.ndarray
    size: np.ndarray

    def __len__(self) -> int:
        return len(self.first) - 1

    def pieces(self, row: int) -> tuple[np.ndarray, np.ndarray]:
        a, b = int(self.first[row]), int(self.first[row + 1])
        return self.at[a:b], self.size[a:b]

    def nbytes(self, row: int) -> int:
        return int(self.size[int(self.first[row]):int(self.first[row + 1])].sum())

    def is_null(self, row: int) -> bool:
        return self.first[row] == self.first[row + 1]


def _varint(b: memoryview, i: int) -> tuple[int, int]:
    out = shift = 0
    while True:
        if i >= len(b) or shift > 63:
            raise ParquetPagesError("a varint runs past the page header")
        x = b[i]
        out |= (x & 0x7F) << shift
        i += 1
        if x < 0x80:
            return out, i
        shift += 7


def _zigzag(n: int) -> int:
    return (n >> 1) ^ -(n & 1)


def _value(b: memoryview, i: int, kind: int, depth: int) -> tuple[object, int]:
    """One thrift compact value of type ``kind`` at ``b[i]``."""
    if depth > MAX_DEPTH:
        raise ParquetPagesError("a page header nests too deeply")
    if kind in (1, 2):  # bools in a field header
        return kind == 1, i
    if kind == 3:
        if i >= len(b):
            raise ParquetPagesError("a byte runs past the page header")
        return b[i], i + 1
    if kind in (4, 5, 6):
        n, i = _varint(b, i)
        return _zigzag(n), i
    if kind == 7:
        if i + 8 > len(b):
            raise ParquetPagesError("a double runs past the page header")
        return None, i + 8
    if kind == 8:
        n, i = _varint(b, i)
        if i + n > len(b):
            raise ParquetPagesError("a string runs past the page header")
        return bytes(b[i:i + n]), i + n
    if kind in (9, 10):
        if i >= len(b):
            raise ParquetPagesError("a list runs past the page header")
        head, i = b[i], i + 1
        n, elem = head >> 4, head & 15
        if n == 15:
            n, i = _varint(b, i)
        out = []
        for _ in range(n):
            if elem in (1, 2):  # a list's bools are one byte each
                if i >= len(b):
                    raise ParquetPagesError("a list runs past the page header")
                out.append(b[i] == 1)
                i += 1
            else:
                x, i = _value(b, i, elem, depth + 1)
                out.append(x)
        return out, i
    if kind == 11:
        n, i = _varint(b, i)
        if n:
            if i >= len(b):
                raise ParquetPagesError("a map runs past the page header")
            kinds, i = b[i], i + 1
            for _ in range(n):
                _, i = _value(b, i, kinds >> 4, depth + 1)
                _, i = _value(b, i, kinds & 15, depth + 1)
        return None, i
    if kind == 12:
        return _struct(b, i, depth + 1)
    raise ParquetPagesError(f"a page header holds thrift type {kind}")


def _struct(b: memoryview, i: int, depth: int = 0) -> tuple[dict, int]:
    """A thrift compact struct: field id to value (nested structs as dicts)."""
    if depth > MAX_DEPTH:
        raise ParquetPagesError("a page header nests too deeply")
    out: dict[int, object] = {}
    fid = 0
    while True:
        if i >= len(b):
            raise ParquetPagesError("a page header runs past the column chunk")
        head, i = b[i], i + 1
        if head == 0:
            return out, i
        delta, kind = head >> 4, head & 15
        if delta:
            fid += delta
        else:
            n, i = _varint(b, i)
            fid = _zigzag(n)
        out[fid], i = _value(b, i, kind, depth)


def _int(d: dict, k: int, what: str, limit: int = 1 << 31) -> int:
    v = d.get(k)
    if type(v) is not int or not 0 <= v < limit:
        raise ParquetPagesError(f"page header field {what} is {v!r}")
    return v


class _Page:
    """A page's bytes as decompressed (``out``), each byte's source: ``seg_out`` the starts of literal runs and
    copies in ``out``, ``seg_src`` a literal's file offset or a copy's start in ``out``, ``seg_lit`` which."""

    def __init__(self, out: bytes, seg_out: list[int], seg_src: list[int], seg_lit: list[bool]) -> None:
        self.out, self.seg_out, self.seg_src, self.seg_lit = out, seg_out, seg_src, seg_lit
        self._starts = np.asarray(seg_out, np.int64)

    def pieces(self, a: int, n: int, into: list[tuple[int, int]]) -> None:
        """The file ranges of ``out[a:a + n]``, appended to ``into`` (adjacent ones merged)."""
        stack = [(a, n)]
        while stack:
            a, n = stack.pop()
            while n:
                k = int(np.searchsorted(self._starts, a, side="right")) - 1
                end = self.seg_out[k + 1] if k + 1 < len(self.seg_out) else len(self.out)
                take = min(n, end - a)
                src = self.seg_src[k] + a - self.seg_out[k]
                if self.seg_lit[k]:
                    if into and into[-1][0] + into[-1][1] == src:
                        into[-1] = (into[-1][0], into[-1][1] + take)
                    else:
                        into.append((src, take))
                        if len(into) > MAX_PIECES:
                            raise ParquetPagesError(f"a value takes more than {MAX_PIECES} pieces (its bytes "
                                                    "compress)")
                else:  # a copy: its bytes are earlier bytes of the page (for an overlapping one, its own)
                    stack.append((a + take, n - take))
                    a, n = src, take
                    continue
                a, n = a + take, n - take


def _plain(data: bytes | memoryview, at: int) -> _Page:
    return _Page(bytes(data), [0], [at], [True])


def _snappy(data: memoryview, at: int, size: int, where: str) -> _Page:
    """A raw snappy block's output and where each of its bytes comes from (``at``: the block's offset in the
    file)."""
    total, i = _varint(data, 0)
    if total > 1 << 31:
        raise ParquetPagesError(f"{where}: a snappy block says it holds {total} bytes")
    out = bytearray()
    seg_out: list[int] = []
    seg_src: list[int] = []
    seg_lit: list[bool] = []
    while i < len(data):
        tag, kind = data[i], data[i] & 3
        if kind == 0:
            n = tag >> 2
            if n >= 60:
                k = n - 59
                if i + 1 + k > len(data):
                    raise ParquetPagesError(f"{where}: a snappy literal runs past the page")
                n = int.from_bytes(data[i + 1:i + 1 + k], "little")
                i += k
            n, i = n + 1, i + 1
            if i + n > len(data):
                raise ParquetPagesError(f"{where}: a snappy literal runs past the page")
            seg_out.append(len(out))
            seg_src.append(at + i)
            seg_lit.append(True)
            out += data[i:i + n]
            i += n
            continue
        if kind == 1:
            if i + 2 > len(data):
                raise ParquetPagesError(f"{where}: a snappy copy runs past the page")
            n, off, i = ((tag >> 2) & 7) + 4, ((tag >> 5) << 8) | data[i + 1], i + 2
        else:
            k = 2 if kind == 2 else 4
            if i + 1 + k > len(data):
                raise ParquetPagesError(f"{where}: a snappy copy runs past the page")
            n, off, i = (tag >> 2) + 1, int.from_bytes(data[i + 1:i + 1 + k], "little"), i + 1 + k
        if not 0 < off <= len(out) or len(out) + n > total:
            raise ParquetPagesError(f"{where}: a snappy copy reaches before the page or past its size")
        seg_out.append(len(out))
        seg_src.append(len(out) - off)
        seg_lit.append(False)
        for _ in range(n):  # overlapping copies repeat bytes: byte by byte (short, rare in images)
            out.append(out[len(out) - off])
        if len(out) > total:
            break
    if len(out) != total:
        raise ParquetPagesError(f"{where}: the snappy block holds {len(out)} bytes, its head says {total}")
    return _Page(bytes(out), seg_out, seg_src, seg_lit)


def _hybrid(b: bytes, i: int, end: int, width: int, count: int, where: str) -> tuple[np.ndarray, int]:
    """``count`` values of parquet's RLE / bit-packed hybrid at ``b[i:end]``."""
    if width > 32:
        raise ParquetPagesError(f"{where}: levels or indices {width} bits wide")
    out = np.empty(count, np.int64)
    got = 0
    nbytes = (width + 7) // 8
    while got < count:
        if i >= end:
            raise ParquetPagesError(f"{where}: the levels or indices run short ({got} of {count})")
        head, i = _varint(memoryview(b), i)
        if head & 1:  # bit-packed: groups of 8
            n = (head >> 1) * 8
            k = n * width // 8
            if i + k > end:
                raise ParquetPagesError(f"{where}: bit-packed values run past the page")
            bits = np.unpackbits(np.frombuffer(b, np.uint8, k, i), bitorder="little").reshape(-1, width or 1)
            vals = (bits[:, :width].astype(np.int64) << np.arange(width)).sum(axis=1) if width else np.zeros(n, int)
            take = min(n, count - got)
            out[got:got + take] = vals[:take]
            i += k
        else:
            n = head >> 1
            if i + nbytes > end:
                raise ParquetPagesError(f"{where}: an RLE run runs past the page")
            v = int.from_bytes(b[i:i + nbytes], "little")
            take = min(n, count - got)
            out[got:got + take] = v
            i += nbytes
        got += take
    return out, i


def _byte_arrays(page: _Page, i: int, count: int, where: str) -> tuple[np.ndarray, np.ndarray]:
    """(start, length) in ``page.out`` of ``count`` PLAIN byte arrays from ``i``."""
    starts, lengths = np.empty(count, np.int64), np.empty(count, np.int64)
    out = page.out
    for k in range(count):
        if i + 4 > len(out):
            raise ParquetPagesError(f"{where}: the values run past the page")
        n = struct.unpack_from("<I", out, i)[0]
        if i + 4 + n > len(out):
            raise ParquetPagesError(f"{where}: a value of {n} bytes runs past the page")
        starts[k], lengths[k] = i + 4, n
        i += 4 + n
    return starts, lengths


def read_values(data: memoryview, chunks: list[Chunk], where: str) -> Values:
    """Every row's pieces of one byte-array column (its chunks in row-group order) of the parquet file ``data``."""
    rows: list[list[tuple[int, int]] | None] = []
    for c in chunks:
        if c.codec not in ("UNCOMPRESSED", "SNAPPY"):
            raise ParquetPagesError(f"{where}: its pages are {c.codec}-compressed, which cannot be pointed at "
                                    "(UNCOMPRESSED or SNAPPY can)")
        if c.start < 0 or c.size < 0 or c.start + c.size > len(data):
            raise ParquetPagesError(f"{where}: a column chunk lies past the file's end")
        _chunk(data, c, rows, where)
    first = np.zeros(len(rows) + 1, np.int64)
    first[1:] = np.cumsum([len(r) if r else 0 for r in rows])
    flat = [p for r in rows if r for p in r]
    at = np.asarray([p[0] for p in flat], np.int64)
    size = np.asarray([p[1] for p in flat], np.int64)
    return Values(first, at, size)


def _chunk(data: memoryview, c: Chunk, rows: list, where: str) -> None:
    """Append the rows of one column chunk."""
    i, end, seen = c.start, c.start + c.size, 0
    dictionary: list[list[tuple[int, int]]] | None = None
    width = c.max_def.bit_length()
    while i < end and seen < c.values:
        head, body = _struct(data[:end], i)
        kind = _int(head, 1, "type", 16)
        size, full = _int(head, 3, "compressed_page_size"), _int(head, 2, "uncompressed_page_size")
        if body + size > end:
            raise ParquetPagesError(f"{where}: a page runs past its column chunk")
        pw = f"{where} page at byte {i}"
        if kind == _DICT:
            d = head.get(7)
            if type(d) is not dict or d.get(2, _PLAIN) not in (_PLAIN, _PLAIN_DICT):
                raise ParquetPagesError(f"{pw}: a dictionary page not PLAIN-encoded")
            page = _decompress(data, body, size, full, c.codec, pw)
            n = _int(d, 1, "num_values")
            if n > len(page.out) // 4:
                raise ParquetPagesError(f"{pw}: a dictionary of {n} values in {len(page.out)} bytes")
            s, z = _byte_arrays(page, 0, n, pw)
            dictionary = [_pieces(page, a, k) for a, k in zip(s.tolist(), z.tolist())]
        elif kind in (_DATA, _DATA2):
            h = head.get(5 if kind == _DATA else 8)
            if type(h) is not dict:
                raise ParquetPagesError(f"{pw}: a data page without its header")
            n, enc = _int(h, 1, "num_values"), _int(h, 4 if kind == _DATA2 else 2, "encoding", 64)
            if seen + n > c.values:
                raise ParquetPagesError(f"{pw}: its pages hold more than the footer's {c.values} values")
            if kind == _DATA:
                if c.max_def and h.get(3, _RLE) != _RLE:
                    raise ParquetPagesError(f"{pw}: definition levels not RLE-encoded")
                page = _decompress(data, body, size, full, c.codec, pw)
                j, defs = 0, None
                if c.max_def:
                    if len(page.out) < 4:
                        raise ParquetPagesError(f"{pw}: its levels run past the page")
                    k = struct.unpack_from("<I", page.out, 0)[0]
                    defs, _ = _hybrid(page.out, 4, min(4 + k, len(page.out)), width, n, pw)
                    j = 4 + k
            else:
                dl, rl = _int(h, 5, "definition_levels_byte_length"), _int(h, 6, "repetition_levels_byte_length")
                if rl or dl > size:
                    raise ParquetPagesError(f"{pw}: repeated values, or levels past the page")
                levels = _plain(data[body:body + dl], body)
                defs = _hybrid(levels.out, 0, dl, width, n, pw)[0] if c.max_def else None
                packed = h.get(7, True) is not False
                values = _decompress(data, body + dl, size - dl, full - dl, c.codec if packed else "UNCOMPRESSED",
                                     pw)
                page, j = values, 0
            present = np.ones(n, bool) if defs is None else defs == c.max_def
            count = int(present.sum())
            if enc == _PLAIN:
                s, z = _byte_arrays(page, j, count, pw)
                vals = [_pieces(page, a, k) for a, k in zip(s.tolist(), z.tolist())]
            elif enc in (_PLAIN_DICT, _RLE_DICT):
                if dictionary is None:
                    raise ParquetPagesError(f"{pw}: dictionary indices without a dictionary page")
                if j >= len(page.out) and count:
                    raise ParquetPagesError(f"{pw}: its indices run past the page")
                idx, _ = _hybrid(page.out, j + 1, len(page.out), page.out[j] if count else 0, count, pw)
                if count and (idx.min() < 0 or idx.max() >= len(dictionary)):
                    raise ParquetPagesError(f"{pw}: an index past the dictionary's {len(dictionary)} values")
                vals = [dictionary[x] for x in idx.tolist()]
            else:
                raise ParquetPagesError(f"{pw}: values in encoding {enc}, which cannot be pointed at (PLAIN or "
                                        "dictionary can)")
            it = iter(vals)
            rows.extend(next(it) if p else None for p in present.tolist())
            seen += n
        else:
            raise ParquetPagesError(f"{pw}: a page of kind {kind}, which cannot be pointed at")
        i = body + size
    if seen != c.values:
        raise ParquetPagesError(f"{where}: its pages hold {seen} values, the footer says {c.values}")


def _pieces(page: _Page, a: int, n: int) -> list[tuple[int, int]]:
    into: list[tuple[int, int]] = []
    page.pieces(a, n, into)
    return into


def _decompress(data: memoryview, at: int, size: int, full: int, codec: str, where: str) -> _Page:
    if codec == "UNCOMPRESSED":
        if size != full:
            raise ParquetPagesError(f"{where}: an uncompressed page of {size} bytes says {full}")
        return _plain(data[at:at + size], at)
    page = _snappy(data[at:at + size], at, size, where)
    if len(page.out) != full:
        raise ParquetPagesError(f"{where}: the page decompresses to {len(page.out)} bytes, its header says {full}")
    return page


__all__ = ["MAX_PIECES", "Chunk", "ParquetPagesError", "Values", "read_values"]
