"""Packed shards that hold no frames: their bytes laid out as a copy shard's, the packets left in the source files.

A ``--codec reference`` index is a packed index (`episodepipes.codec.chunk`) whose shards are never written: every
shard is *virtual*, the bytes ``write --codec copy`` would have written, tiled by *pieces*. A piece is either a run
of *literal* bytes (tar headers, pack tables, record heads, padding), kept beside the index in one file (deflated in
blocks, `reference_blocks`), one record's arrays' rows, kept beside the index in the *rows file* (every step's rows
back to back, then a CRC32 per block of `ROW_BLOCK` steps), or one packet, kept where it is: a byte range of a
source video file. So the records, their CRC32s, the key frames and the shards' sha256 are exactly a copy import's,
and every reader of the packed layout reads a virtual shard through `ReferenceSource` (a byte source) as it reads a
tar. A step read only for its arrays reads its row from the rows file (`ReferenceSource.step_rows`, checked by its
block's CRC32), not its record: no packet is fetched for an action horizon.

Here: the piece table a writer gathers (`Pieces`; an episode's pieces are laid out by `reference_layout`), the
pieces' checks (`check_pieces`, input from strangers), the source files' names (`check_file`: relative, inside the
source root) and `ReferenceSource`, which serves byte ranges of virtual shards. The byte sources of the source
files, the literal file and the index folder are given to it (this package imports no byte source).
"""

from __future__ import annotations

import re
import threading
import zlib
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from episodepipes.codec.reference_layout import LITERAL, ROWS, EpisodeLayout
from episodepipes.format import TAR_END

PIECE_DTYPES = {"start": "<u8", "file": "<i4", "at": "<u8"}
STAMP = 1 << 16  # bytes at each end of a source file whose crc32 the index keeps (the cheap content check)
ROW_BLOCK = 64  # steps of the rows file under one CRC32 (a horizon reads one or two blocks)
MAX_DEPTH = 16  # folders a source file's name may go down from the source root
_PART = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-=]{0,254}")


def check_file(name: object) -> str:
    """``name`` if it is a relative path of plain names (``videos/front/chunk-000/file-000.mp4``), else ValueError:
    no absolute path, scheme, ``..``, empty or hidden part, backslash; where a file is read from is the caller's."""
    parts = name.split("/") if isinstance(name, str) else []
    if not parts or len(parts) > MAX_DEPTH or not all(_PART.fullmatch(p) and ".." not in p for p in parts):
        raise ValueError(f"source file name {str(name)[:120]!r} is not a relative path of plain names inside the "
                         "source root (no absolute path, URL, '..' or hidden part)")
    return name  # type: ignore[return-value]


def rows_bytes(steps: int, width: int) -> int:
    """The rows file's size: ``steps`` rows of ``width`` bytes, then a CRC32 per `ROW_BLOCK` of them."""
    return steps * width + 4 * -(-steps // ROW_BLOCK)


class Pieces:
    """The piece table of a writer: literal bytes and rows gathered, each piece's (start in its shard, file, at)."""

    def __init__(self) -> None:
        self.start: list[int] = []
        self.file: list[int] = []
        self.at: list[int] = []
        self.literal = bytearray()
        self.rows: list[np.ndarray] = []  # per episode, (steps, bytes)
        self.steps = 0

    def add(self, pos: int, part: bytes) -> None:
        """Append literal bytes that start at byte ``pos`` of their shard (merged with a literal piece before)."""
        if not part:
            return
        if not self.file or self.file[-1] != LITERAL or pos == 0:
            self.start.append(pos)
            self.file.append(LITERAL)
            self.at.append(len(self.literal))
        self.literal += part

    def extend(self, pos: int, lay: EpisodeLayout) -> None:
        """Append an episode's pieces (`reference_layout.layout`), which start at byte ``pos`` of its shard; its
        first literal run merges with a literal piece before it, as `add` merges."""
        start, file = lay.start + pos, lay.file
        width = max(lay.rows.shape[1], 1)
        at = np.where(file == LITERAL, lay.at + len(self.literal),
                      np.where(file == ROWS, self.steps + lay.at // width, lay.at))  # a rows piece: its step, for now
        if len(file) and file[0] == LITERAL and pos and self.file and self.file[-1] == LITERAL:
            start, file, at = start[1:], file[1:], at[1:]
        self.start += start.tolist()
        self.file += file.tolist()
        self.at += at.tolist()
        self.literal += lay.literal
        self.rows.append(lay.rows)
        self.steps += len(lay.rows)

    def end_shard(self, pos: int) -> None:
        """The shard's end of archive (its last bytes)."""
        self.add(pos, TAR_END)

    @property
    def width(self) -> int:
        """The rows file's bytes a step: the widest episode's rows (a narrower one's are zero padded)."""
        return max((r.shape[1] for r in self.rows), default=0)

    def columns(self) -> dict[str, np.ndarray]:
        file, at = np.asarray(self.file, "<i4"), np.asarray(self.at, np.int64)
        at = np.where(file == ROWS, at * self.width, at)
        return {"start": np.asarray(self.start, "<u8"), "file": file, "at": at.astype("<u8")}

    def rows_file(self) -> bytes:
        """The rows file: every step's rows (`width` bytes each), then the CRC32 of each `ROW_BLOCK` of them."""
        width = self.width
        rows = np.zeros((self.steps, width), np.uint8)
        k = 0
        for r in self.rows:
            rows[k:k + len(r), :r.shape[1]] = r
            k += len(r)
        view = memoryview(rows.reshape(-1))
        block = ROW_BLOCK * width
        crcs = np.asarray([zlib.crc32(view[a:a + block]) for a in range(0, len(view), block)] if width else
                          [0] * -(-self.steps // ROW_BLOCK), "<u4")
        return rows.tobytes() + crcs.tobytes()


def check_pieces(cols: dict[str, Any], shard_bytes: Sequence[int], file_bytes: Sequence[int],
                 literal_bytes: int, rows: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Check a piece table read from a file (input from strangers); returns (each shard's first piece, one past
    the last; each piece's size). Every shard starts with a piece at byte 0, pieces go forward inside their shard,
    each names a file of the list (or the literal file, or the rows file of ``rows`` bytes of rows, if any) and lies
    inside it, and the literal pieces tile that file."""
    start, file, at = (np.asarray(cols[k]) for k in ("start", "file", "at"))
    if not (start.dtype == np.dtype("<u8") and file.dtype == np.dtype("<i4") and at.dtype == np.dtype("<u8")) \
            or not (start.ndim == file.ndim == at.ndim == 1) or not (len(start) == len(file) == len(at)):
        raise ValueError("the piece columns should be 1-D <u8 start, <i4 file and <u8 at of one length")
    first = np.flatnonzero(start == 0)
    if len(first) != len(shard_bytes) or (len(first) and first[0] != 0):
        raise ValueError(f"the pieces start {len(first)} shards, the index lists {len(shard_bytes)}")
    bounds = np.append(first, len(start))
    shard_of = np.repeat(np.arange(len(first)), np.diff(bounds))
    end = np.asarray(shard_bytes, np.int64)[shard_of] if len(start) else np.zeros(0, np.int64)
    s = start.astype(np.int64) if len(start) and int(start.max()) < 2**62 else None
    if s is None and len(start):
        raise ValueError("a piece starts past any shard's size")
    nxt = np.empty(len(start), np.int64)
    nxt[:-1] = s[1:] if len(start) else nxt[:-1]
    nxt[bounds[1:] - 1] = end[bounds[1:] - 1] if len(start) else nxt[bounds[1:] - 1]
    size = nxt - s if len(start) else np.zeros(0, np.int64)
    if (size <= 0).any():
        k = int(np.argmax(size <= 0))
        raise ValueError(f"piece {k} has no bytes or goes back (it starts at {int(s[k])}, the next at {int(nxt[k])})")
    if ((file < (LITERAL if rows is None else ROWS)) | (file >= len(file_bytes))).any():
        raise ValueError(f"a piece names a file outside the list of {len(file_bytes)}")
    limit = np.where(file == LITERAL, literal_bytes,
                     np.where(file == ROWS, rows or 0, np.asarray([*file_bytes, 0, 0], np.int64)[file]))
    if len(at) and (int(at.max()) >= 2**62 or (at.astype(np.int64) + size > limit).any()):
        raise ValueError("a piece lies past the end of its file")
    lit = file == LITERAL
    if int(size[lit].sum()) != literal_bytes or (len(at[lit]) and (at[lit][0] != 0 or (
            np.diff(at[lit].astype(np.int64)) != size[lit][:-1]).any())):
        raise ValueError(f"the literal pieces do not tile the literal file's {literal_bytes} bytes in order")
    return bounds, size


class FileInfo(NamedTuple):
    """A source file as indexed: its name under the source root, its size, and the crc32 of its first and last
    `STAMP` bytes (how a file replaced after indexing is told apart without reading it whole)."""

    name: str
    bytes: int
    head: int
    tail: int


def stamp(read: Callable[[int, int], bytes], size: int) -> tuple[int, int]:
    """(crc32 of the first, of the last `STAMP` bytes) of a file of ``size`` bytes, read with ``read(offset, n)``."""
    n = min(STAMP, size)
    head = zlib.crc32(read(0, n))
    return head, head if n == size else zlib.crc32(read(size - n, n))  # a small file (an image): read once


class ReferenceSource:
    """The byte source of a reference index: virtual shards served from their pieces; other names (the index's own
    files) from the index folder's source. Thread-safe; `close` closes what it opened.

    Args:
        root: the index folder (for messages), as its source names it.
        folder: the index folder's byte source (the literal file, the columns, the statistics).
        shards: every shard's name and size, in index order.
        pieces: the piece columns (`check_pieces` checks them here).
        files: the source files, as indexed.
        literal: the literal file's name in ``folder`` and its size.
        open_file: a source file's name to (its byte source, the name to read in it): called once per file.
        where: how a source file is named in messages (its path or URL).
        stale: the fix a changed source file's error names.
        rows: the rows file's name in ``folder``, its bytes a step and its steps; None in an index whose records'
            rows are literal bytes (written before the rows file).
        literal_source: where the literal bytes are read (`reference_blocks.BlockFile`, a deflated literal file);
            None: ``folder`` (an index written before it deflated them).
    """

    def __init__(self, root: str, folder: Any, shards: Sequence[tuple[str, int]], pieces: dict[str, Any],
                 files: Sequence[FileInfo], literal: tuple[str, int], open_file: Callable[[str], tuple[Any, str]],
                 where: Callable[[str], str], error: type[Exception], stale: str,
                 rows: tuple[str, int, int] | None = None, literal_source: Any = None) -> None:
        self.root, self.folder = root, folder
        self._literal_src = folder if literal_source is None else literal_source
        self.files = files if hasattr(files, "sizes") else list(files)  # a table of image files: kept as it is
        sizes = getattr(files, "sizes", None)
        self._shards = {name: (i, size) for i, (name, size) in enumerate(shards)}
        self.rows = rows
        self._bounds, self._size = check_pieces(pieces, [s for _, s in shards],
                                                [f.bytes for f in files] if sizes is None else sizes, literal[1],
                                                None if rows is None else rows[1] * rows[2])
        self._start = np.asarray(pieces["start"]).astype(np.int64)
        self._file, self._at = np.asarray(pieces["file"]), np.asarray(pieces["at"]).astype(np.int64)
        self._literal = literal[0]
        self._open, self._where, self._error, self._stale = open_file, where, error, stale
        self._opened: dict[int, tuple[Any, str]] = {}
        self._lock = threading.Lock()
        self.counts = {"files_checked": 0}

    def _source_of(self, f: int) -> tuple[Any, str]:
        """File ``f``'s byte source and name, opened and checked against the index at its first use."""
        got = self._opened.get(f)
        if got is not None:
            return got
        with self._lock:
            got = self._opened.get(f)
            if got is None:
                info = self.files[f]
                src, name = self._open(info.name)
                size = src.size(name)
                if size != info.bytes or stamp(lambda off, n: src.read(name, off, n), size) != (info.head, info.tail):
                    what = f"{size} bytes, indexed with {info.bytes}" if size != info.bytes else \
                        f"its first or last {STAMP} bytes differ from the indexed file's"
                    raise self._error(f"{self._where(info.name)} changed after it was indexed ({what}); {self._stale}")
                self.counts["files_checked"] += 1
                got = self._opened[f] = (src, name)
        return got

    def size(self, name: str) -> int:
        shard = self._shards.get(name)
        return shard[1] if shard is not None else self.folder.size(name)

    def read(self, name: str, offset: int, size: int) -> bytes:
        return self.read_ranges(name, [(offset, size)])[0]

    options = None  # no coalescing options of its own: a virtual shard's ranges are merged where they touch

    def read_many(self, calls: Sequence[tuple[str, Sequence[tuple[int, int]]]], *, views: bool = False,
                  ) -> list[list[bytes]]:
        """Every call's ranges, as bytes (``views`` is a `RemoteSource`'s flag: bytes serve either way)."""
        return [self.read_ranges(name, ranges) for name, ranges in calls]

    def read_file(self, name: str, *, limit: int | None = None) -> bytes:
        if name in self._shards:
            return self.read(name, 0, self._shards[name][1])
        return self.folder.read_file(name, limit=limit)

    def read_ranges(self, name: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """Each range's bytes, from the pieces of the virtual shard that cover it (`_pieces_of`, `_gather`)."""
        shard = self._shards.get(name)
        if shard is None:
            return self.folder.read_ranges(name, ranges)
        i, total = shard
        for off, size in ranges:
            if off < 0 or size < 0 or off + size > total:
                raise self._error(f"{self.root}/{name}: bytes {off}..{off + size} lie past its {total} bytes")
        return self._gather(*self._pieces_of(int(self._bounds[i]), int(self._bounds[i + 1]), ranges), len(ranges))

    def _pieces_of(self, lo: int, hi: int, ranges: Sequence[tuple[int, int]],
                   ) -> tuple[list[int], list[int], list[int], list[int]]:
        """The pieces ``lo..hi-1`` of a shard that cover each range (in range order, then shard order): each one's
        range number, file, and (at, size) in its file cut to the range. One range (a sample's record, the common
        call) is two scalar searches and a few slices; many (a block read) are searched together."""
        starts = self._start[lo:hi]
        if len(ranges) == 1:
            off, end = ranges[0][0], ranges[0][0] + ranges[0][1]
            if end <= off:
                return [], [], [], []
            a = lo + int(starts.searchsorted(off, side="right")) - 1
            b = lo + int(starts.searchsorted(end, side="left"))
            at, size, start = self._at[a:b].tolist(), self._size[a:b].tolist(), self._start[a:b].tolist()
            at[0] += off - start[0]
            size[0] -= off - start[0]
            size[-1] -= start[-1] + int(self._size[b - 1]) - end
            return [0] * (b - a), self._file[a:b].tolist(), at, size
        spans = np.asarray(ranges, np.int64).reshape(-1, 2)
        off, end = spans[:, 0], spans[:, 0] + spans[:, 1]
        a = lo + np.searchsorted(starts, off, side="right") - 1
        b = lo + np.searchsorted(starts, end, side="left")
        count = np.where(end > off, b - a, 0)
        cum = np.cumsum(count)
        if not len(cum) or not cum[-1]:  # no range, or every one empty
            return [], [], [], []
        rng = np.repeat(np.arange(len(spans)), count)
        k = np.arange(int(cum[-1])) - np.repeat(cum - count, count) + np.repeat(a, count)
        at, size = self._at[k], self._size[k].copy()
        first, last = (cum - count)[count > 0], cum[count > 0] - 1
        cut = off[count > 0] - self._start[k[first]]
        at[first] += cut
        size[first] -= cut
        size[last] -= self._start[k[last]] + self._size[k[last]] - end[count > 0]
        return rng.tolist(), self._file[k].tolist(), at.tolist(), size.tolist()

    def _gather(self, rng: list[int], file: list[int], at: list[int], size: list[int], n: int) -> list[bytes]:
        """The ``n`` ranges' bytes from their pieces (`_pieces_of`): per range, one read per file where its pieces
        lie close together (a run's packets of one camera are adjacent in its file), else one read per piece."""
        groups: dict[tuple[int, int], list[int]] = {}
        for j, key in enumerate(zip(rng, file)):
            groups.setdefault(key, []).append(j)
        views: list[bytes | memoryview] = [b""] * len(rng)
        for (_, f), js in groups.items():
            src, name = (self._literal_src, self._literal) if f == LITERAL else (self.folder, self.rows[0]) \
                if f == ROWS else self._source_of(f)  # type: ignore[index]
            first, last = min(at[j] for j in js), max(at[j] + size[j] for j in js)
            if last - first <= 2 * sum(size[j] for j in js) + (1 << 16):
                data = memoryview(src.read(name, first, last - first))
                for j in js:
                    views[j] = data[at[j] - first:at[j] - first + size[j]]
            else:
                for j, d in zip(js, src.read_ranges(name, [(at[j], size[j]) for j in js])):
                    views[j] = d
        out: list[list[bytes | memoryview]] = [[] for _ in range(n)]
        for j, r in enumerate(rng):
            out[r].append(views[j])
        return [b"".join(parts) for parts in out]

    def step_rows(self, row: int, count: int) -> memoryview | None:
        """The rows of steps ``row .. row + count`` (frame rows of the index) as one ``(count * width)`` view, read
        from the rows file by the blocks that hold them; None when a block fails its CRC32 (or is cut short).
        Only for an index with a rows file (`rows` not None)."""
        name, width, steps = self.rows  # type: ignore[misc]
        if row < 0 or count < 0 or row + count > steps:
            raise self._error(f"{self.root}/{name}: steps {row}..{row + count} lie past its {steps} steps")
        a, b = row // ROW_BLOCK, -(-(row + count) // ROW_BLOCK)
        lo, hi = a * ROW_BLOCK * width, min(b * ROW_BLOCK, steps) * width
        data, crcs = self.folder.read_ranges(name, [(lo, hi - lo), (steps * width + 4 * a, 4 * (b - a))])
        if len(data) != hi - lo or len(crcs) != 4 * (b - a):
            return None
        view, want = memoryview(data), np.frombuffer(crcs, "<u4")
        block = ROW_BLOCK * width
        if any(zlib.crc32(view[k * block:(k + 1) * block]) != int(c) for k, c in enumerate(want)):
            return None
        at = (row - a * ROW_BLOCK) * width
        return view[at:at + count * width]

    def close(self) -> None:
        with self._lock:
            opened, self._opened = self._opened, {}
        for src, _ in {id(s): (s, n) for s, n in opened.values()}.values():
            src.close()
        self.folder.close()

    def __repr__(self) -> str:
        return f"ReferenceSource({self.root!r}, files={len(self.files)})"
