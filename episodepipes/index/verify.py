"""Verify a shard folder against its index: the one implementation behind `EpisodeIndex.verify`,
`EpisodeIndex.problems` and the ``verify`` command.

Only the index's own, validated shard names and the fixed column names are opened.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from episodepipes.errors import ShardTruncatedError
from episodepipes.filebytes import sha256_file
from episodepipes.format import COLUMNS, INDEX_NAME
from episodepipes.index.check import IndexFormatError
from episodepipes.index.episodes import Episode
from episodepipes.index.records import Segment, Shard
from episodepipes.index.shardread import chunks, digest, ranges
from episodepipes.index.tables import Tables
from episodepipes.normstats import StatsTable
from episodepipes.shardio import ByteSource
from episodepipes.tarmembers import frame_fields

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

Problem = tuple[type[Exception], str]
Pread = Callable[[int, int], bytes]  # (size, offset) -> bytes


class Checked(Protocol):
    """What verify reads of an index (an `EpisodeIndex`): named by what it reads, not by class, so this module does
    not import the index module that calls it."""

    meta: dict
    version: int
    shards: list[Shard]

    @property
    def root(self) -> Path | str: ...

    @property
    def remote(self) -> bool: ...

    @property
    def source(self) -> ByteSource: ...

    @property
    def tables(self) -> Tables: ...

    def load_stats(self) -> tuple[StatsTable | None, dict[tuple[str, str], str]]: ...

    def segments_in(self, shard: int) -> list[tuple[Episode, Segment]]: ...

    def shard_size(self, shard: int) -> int | None: ...

    def shard_path(self, shard: int) -> Path: ...

    def shard_bytes(self, shard: int) -> AbstractContextManager[memoryview]: ...


def problems(ix: Checked, shards: Iterable[int] | None = None, *, members: bool = False) -> list[Problem]:
    """(exception type, one line) for every problem, in the order a reader would meet them."""
    out: list[Problem] = []
    for name, c in sorted(ix.meta.get("columns", {}).items()) if ix.version == 2 else ():
        col = COLUMNS[name][0]
        sha = hashlib.sha256(ix.source.read_file(col)).hexdigest() if ix.remote else sha256_file(ix.root / col)
        if sha != c["sha256"]:
            out.append((IndexFormatError, f"column {col}: sha256 mismatch with {INDEX_NAME}; the file "
                                          "changed: restore it or re-shard"))
    out += stats_problems(ix)
    try:
        t = ix.tables  # every frame's offsets, before any is used to slice a shard
        t.check_segments(range(len(t.segments)))
    except IndexFormatError as e:
        return [*out, (IndexFormatError, str(e))]
    for i in range(len(ix.shards)) if shards is None else sorted(set(shards)):
        s = ix.shards[i]
        eps = ", ".join(dict.fromkeys(e.id for e, _ in ix.segments_in(i))) or "none"
        size = ix.shard_size(i)  # a local file, or a remote object through the index's source
        if size is None:
            out.append((FileNotFoundError, f"shard {s.name} is missing (episodes {eps}); restore it or re-shard"))
            continue
        if size != s.bytes:
            out.append((IndexFormatError, f"shard {s.name} has {size} bytes, index says {s.bytes} (episodes {eps}); "
                                          "truncated? re-shard it"))
            continue
        try:
            with _shard_reads(ix, i) as (parts, pread):
                frames = _crc_frames(ix, i)
                sha, crcs = digest(parts, [(a, size) for _, _, a, size, _ in frames])
                if sha != s.sha256:
                    out.append((IndexFormatError, f"shard {s.name}: sha256 mismatch (episodes {eps}); the file "
                                                  "changed, re-shard it"))
                bad = [(eid, frame) for (eid, frame, _, _, crc), got in zip(frames, crcs) if got != crc]
                if bad:
                    out.append((IndexFormatError, f"shard {s.name}: crc32 mismatch in {len(bad)} frames, the first "
                                                  f"episode {bad[0][0]!r} frame {bad[0][1]}; its bytes changed: "
                                                  "restore the shard or re-shard"))
                if members:
                    check = _check_packed if ix.meta.get("layout") == "packed" else _check_members
                    for e, seg in ix.segments_in(i):
                        out += [(IndexFormatError, m) for m in check(ix, pread, s.name, e, seg)]
        except ShardTruncatedError as e:  # cut short while it was read: its size was right a moment before
            out.append((ShardTruncatedError, f"shard {s.name} (episodes {eps}): {e}"))
    return out


@contextlib.contextmanager
def _shard_reads(ix: Checked, i: int) -> Iterator[tuple[Iterable[memoryview], Pread]]:
    """A shard's bytes in order (for `digest`) and its checked ranges: a local file read in chunks and checked reads
    (`episodepipes.index.shardread` says why not a mapping), a remote object downloaded whole (one GET)."""
    if ix.remote:
        with ix.shard_bytes(i) as view:
            yield [view], lambda size, off: bytes(view[off:off + size])
        return
    path = ix.shard_path(i)
    with ranges(path) as pread:
        yield chunks(path, ix.shards[i].bytes), pread


def _crc_frames(ix: Checked, i: int) -> list[tuple[str, int, int, int, int]]:
    """(episode id, frame, offset, size, crc32) of every frame of shard ``i`` the index has a crc32 for, in index
    order (as `EpisodeIndex.bad_frames` checks them)."""
    out = []
    size = ix.tables.size
    for e, seg in ix.segments_in(i):
        row = e.rows[seg.first]
        sizes = size[row:row + seg.count].tolist()  # a frame's bytes (packed: gaps excluded)
        out += [(e.id, seg.first + k, a, n, crc) for k, (a, n, crc) in enumerate(zip(seg.offsets, sizes,
                                                                                    seg.crc32 or ()))]
    return out


def _check_members(ix: Checked, pread: Pread, name: str, e: Episode, seg: Segment) -> list[str]:
    """Parse every frame's members at its indexed byte range, with the same parser the pipes read with."""
    eid = e.id
    for k, (start, end) in enumerate(zip(seg.offsets, (*seg.offsets[1:], seg.end))):
        frame = seg.first + k
        try:
            frame_fields(pread, start, end, eid, frame,
                         where=f"shard {name}: episode {eid!r} frame {frame}")
        except ValueError as e:
            return [str(e)]
    return []


def _check_packed(ix: Checked, pread: Pread, name: str, e: Episode, seg: Segment) -> list[str]:
    """Walk the segment's chunk members as the writer laid them out (tar headers, pack tables, records) and
    compare every record's place and key frame with the index's; then parse each record as the pipes do."""
    from episodepipes.codec.chunk import parse_record, spans
    from episodepipes.index.v2 import packed_spans

    row = e.rows[seg.first]
    want = packed_spans(ix.tables.columns, row, seg.count, e.rows.start)
    where = f"shard {name}: episode {e.id!r} frames {seg.first}..{seg.first + seg.count - 1}"
    try:
        got = spans(pread(want["end"] - want["offsets"][0], want["offsets"][0]), where=where)
    except ValueError as err:
        return [str(err)]
    bounds = [a - want["offsets"][0] for a in want["offsets"]]
    if (got.heads, got.sizes, [f + seg.first for f in got.keys]) != (want["heads"], want["sizes"], want["keys"]) \
            or [sum(got.spans[:k]) for k in range(seg.count)] != bounds:
        return [f"{where}: the chunk members do not hold the records where the index puts them; re-shard it"]
    for k, (a, size) in enumerate(zip(seg.offsets, want["sizes"])):
        try:
            rec = parse_record(pread(size, a), len(e.cameras), len(e.arrays), where=f"{where} frame {k}")
        except ValueError as err:
            return [str(err)]
        if max(rec.backs, default=0) > seg.first + k - want["keys"][k]:
            return [f"{where} frame {seg.first + k}: its record's decode starts before the index's key frame; "
                    "re-shard it"]
        for (key, spec), row in zip(sorted(e.arrays.items()), rec.rows):  # as the pipes' array_members checks it
            if len(row) != np.dtype(spec.dtype).itemsize * math.prod(spec.shape):
                return [f"{where} frame {seg.first + k}: array {key!r} has {len(row)} bytes in its record, not one "
                        f"{spec.dtype} {tuple(spec.shape)} step; re-shard it"]
    return []


def stats_problems(ix: Checked) -> list[tuple[type[Exception], str]]:
    """`verify`'s check of the statistics: the side file read whole, its sha256 and every field checked."""
    try:
        ix.load_stats()
    except IndexFormatError as e:
        return [(IndexFormatError, str(e))]
    return []
