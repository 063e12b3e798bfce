"""`Tables`: an index's tables as one read-only value, what the code around `EpisodeIndex` reads them through.

`Episode`, the statistics, the v1 layout, verify, ``info`` and ``upgrade`` take this value (`EpisodeIndex.tables`)
instead of reaching into the index's private attributes, so the index can change how it holds its tables without
breaking them. It is a thin view: its fields are the index's own arrays (a v2 index's memory-mapped columns), never
copies, and nothing in it is made per episode or per frame. A v2 index's per-frame values are checked per segment
on first use (`check_segments`), as they always were.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from episodepipes.index import idcols
from episodepipes.index import v2 as indexv2
from episodepipes.index.check import IndexFormatError
from episodepipes.index.columns import PER_FRAME, prefetch, scanning
from episodepipes.index.idcols import EpisodeAttrs
from episodepipes.index.records import ArraySpec, Camera, dtype_str, read_camera
from episodepipes.index.search import Sorted
from episodepipes.index.v2 import COUNT, FIRST, LENGTH, ROW, SCHEMA, SEGMENT, SHARD

SCAN = 1024  # segments checked at once above which their columns are read as a scan (`columns.scanning`)
PREFETCH = 8  # segments checked at once from which their rows' pages are asked for together (`columns.prefetch`)
PREFETCH_PART = 128  # segments whose rows are asked for at once
Schema = tuple[dict[str, Camera], dict[str, ArraySpec]]


@dataclass(frozen=True, eq=False)
class Tables:
    """An index's tables, both versions held as v2's (`episodepipes.index.v2`). Treat every field as read-only.

    Attributes:
        episodes: one uint64 row per episode, its columns numbered by `episodepipes.index.v2`'s ``FIRST`` (first
            frame row), ``LENGTH``, ``SEGMENT`` (first segment), ``SCHEMA``, ``SPLIT``, ``PROMPT`` and ``FPS``
            (codes into `schemas`, `splits`, `prompts` and `fps`).
        segments: one row per run of an episode's frames in one shard, columns ``SHARD``, ``ROW`` (first frame
            row) and ``COUNT``.
        offset: per frame row, the byte its members (or its record) start at in its shard.
        size: per frame row, its bytes from `offset`.
        crc: per frame row, the zlib.crc32 of those bytes; None when the index has none.
        columns: every column by name (`episodepipes.format.COLUMNS`: the tables above and a layout's extra ones,
            ``member`` and ``key`` of the packed layout).
        splits: the split names.
        prompts: the prompts.
        fps: the frame rates.
        schemas: (cameras, arrays) of each schema; episodes of one schema share these dicts.
        episode_meta: episode number -> its attributes, only for the episodes that have some (a read-only
            mapping over the ``attr`` column: nothing is made per episode until asked).
        ids: every episode's id, the mapped ``|S<width>`` column (`episodepipes.index.idcols`).
        id_order: the episode numbers in the ids' sorted order (``np.searchsorted(ids, key, sorter=id_order)``).
        attr: each episode's code into `attrs`.
        attrs: the distinct attribute sets.
    """

    episodes: np.ndarray
    segments: np.ndarray
    offset: np.ndarray
    size: np.ndarray
    crc: np.ndarray | None
    columns: Mapping[str, np.ndarray]
    splits: Sequence[str]
    prompts: Sequence[str]
    fps: Sequence[float]
    schemas: Sequence[Schema]
    episode_meta: Mapping[int, dict[str, Any]]
    ids: np.ndarray
    id_order: np.ndarray
    attr: np.ndarray
    attrs: Sequence[dict[str, Any]]
    _checks: _SegmentChecks = field(repr=False)
    _search: dict[str, Sorted] = field(repr=False, default_factory=dict)

    @classmethod
    def of(cls, meta: dict, cols: dict[str, np.ndarray], checked: np.ndarray, file: Path | str,
           attrs: Sequence[dict[str, Any]]) -> Tables:
        """The tables of a checked index: ``meta`` its v2 metadata, ``cols`` its columns (held, not copied; the id
        columns among them), ``checked`` which segments' frames are already checked (a v1 index checks all at open),
        ``attrs`` the attribute sets the ``attr`` column codes."""
        schemas = [({n: read_camera(n, c) for n, c in sc["cameras"].items()},
                    {n: ArraySpec(n, dtype_str(a["dtype"]), tuple(a["shape"]), a.get("source", n))
                     for n, a in sc["arrays"].items()}) for sc in meta["schemas"]]
        return cls(cols["episodes"], cols["segments"], cols["offset"], cols["size"], cols.get("crc32"),
                   cols, meta["splits"], meta["prompts"], [float(x) for x in meta["fps"]],
                   schemas, EpisodeAttrs(cols["attr"], attrs), cols["ids"], cols["id_order"], cols["attr"], attrs,
                   _SegmentChecks(meta, checked, file))

    def sorted_column(self, table: str, column: int) -> Sorted:
        """Column ``column`` of the (row-major) ``"episodes"`` or ``"segments"`` table, searched without copying it:
        ``FIRST`` and ``SEGMENT`` of the episodes and ``ROW`` of the segments strictly increase (checked at open).

        Args:
            table: ``"episodes"`` or ``"segments"``.
            column: ``FIRST`` or ``SEGMENT`` (episodes), ``ROW`` (segments).
        """
        key = f"{table}:{column}"
        got = self._search.get(key)
        if got is None:
            got = self._search[key] = Sorted(getattr(self, table)[:, column])
        return got

    def segment_of_rows(self, rows: np.ndarray) -> np.ndarray:
        """The segment (row of `segments`) each frame row is in, int64; O(log) reads per row, nothing copied.

        Args:
            rows: frame rows, each below the index's frames.
        """
        return self.sorted_column("segments", ROW).search(rows, side="right") - 1

    def episode_of_rows(self, rows: np.ndarray) -> np.ndarray:
        """The episode number each frame row is in, int64; O(log) reads per row, nothing copied.

        Args:
            rows: frame rows, each below the index's frames.
        """
        return self.sorted_column("episodes", FIRST).search(rows, side="right") - 1

    def segment_in_episodes(self, rows: np.ndarray, numbers: np.ndarray) -> np.ndarray:
        """The segment each frame row is in, int64, given the episode each row is in (``numbers``): read from those
        episodes' own rows of the tables, a few values each, never a search of a whole column (whose first use
        would touch a page of it per `episodepipes.index.search.STEP` rows: what grows with the episodes).

        Args:
            rows: frame rows.
            numbers: the episode of each row; a row outside its episode raises ValueError.
        """
        rows, numbers = np.asarray(rows, np.int64), np.asarray(numbers, np.int64)
        ep, seg = self.episodes, self.segments
        if len(rows) != len(numbers) or (len(numbers) and not (0 <= numbers.min() and numbers.max() < len(ep))):
            raise ValueError(f"{len(numbers)} episode numbers for {len(rows)} rows, or a number past the "
                             f"{len(ep)} episodes")
        mine = ep[numbers]  # each row's episode: its first frame row, length and first segment
        first = mine[:, FIRST].astype(np.int64)
        if not ((rows >= first) & (rows < first + mine[:, LENGTH].astype(np.int64))).all():
            raise ValueError("a frame row is not in the episode given for it")
        lo = mine[:, SEGMENT].astype(np.int64)
        nxt = numbers + 1
        hi = np.where(nxt < len(ep), ep[np.minimum(nxt, len(ep) - 1), SEGMENT].astype(np.int64), len(seg))
        many = np.flatnonzero(hi - lo > 1)  # episodes over several shards: a binary search of their few segments
        if len(many):
            a, b, r = lo[many], hi[many], rows[many]
            while True:  # seg[a, ROW] <= r < seg[b, ROW] (b: the next episode's first segment)
                open_ = b - a > 1
                if not open_.any():
                    break
                mid = (a + b) // 2
                right = open_ & (seg[np.where(open_, mid, a), ROW].astype(np.int64) <= r)
                a = np.where(right, mid, a)
                b = np.where(open_ & ~right, mid, b)
            lo[many] = a
        return lo

    def episode_of_segments(self, js: np.ndarray) -> np.ndarray:
        """The episode number each segment belongs to, int64; O(log) reads per segment, nothing copied.

        Args:
            js: segment numbers, rows of `segments`.
        """
        return self.sorted_column("episodes", SEGMENT).search(js, side="right") - 1

    def numbers(self, ids: Sequence[str]) -> np.ndarray:
        """The episode number of each id (int64), -1 where the index has no such episode: one search of the
        mapped id column, nothing per episode read or made.

        Args:
            ids: episode ids.
        """
        return idcols.numbers(self.ids, self.id_order, ids)

    def check_segments(self, js: Iterable[int], owners: Sequence[int] | None = None) -> None:
        """Check the per-frame values of segments ``js`` before any of them is used to slice a shard (v2 checks them
        on first use), raising `IndexFormatError` naming the file, episode and segment.

        Args:
            js: segment numbers, rows of `segments`.
            owners: the episode each of ``js`` belongs to, when the caller knows them (else found by a search).
        """
        self._checks.check(self, js, owners)

    def episode_segments(self, n: int) -> tuple[tuple[int, int, int], ...]:
        """(shard, first frame, count) of each of episode ``n``'s segments, their frames checked.

        Args:
            n: an episode number, a row of `episodes`.
        """
        j0 = int(self.episodes[n, SEGMENT])
        j1 = int(self.episodes[n + 1, SEGMENT]) if n + 1 < len(self.episodes) else len(self.segments)
        self.check_segments(range(j0, j1), [n] * (j1 - j0))
        first = int(self.episodes[n, FIRST])
        return tuple((s, r - first, c) for s, r, c in self.segments[j0:j1].tolist())


class _SegmentChecks:
    """Which segments' frames are checked, and what the check needs from the index's metadata (messages name
    ``file``); the one mutable part of `Tables`."""

    def __init__(self, meta: dict, checked: np.ndarray, file: Path | str) -> None:
        self.meta, self.checked, self.file = meta, checked, file
        self.step_bytes: dict[int, int] = {}  # schema code -> bytes of one step of its arrays

    def check(self, t: Tables, js: Iterable[int], owners: Sequence[int] | None = None) -> None:
        js = list(js)
        todo = [k for k, j in enumerate(js) if not self.checked[j]]
        if not todo:
            return
        if owners is None:
            found = t.episode_of_segments(np.asarray([js[k] for k in todo], np.int64)).tolist()
        else:  # the caller's: checked to hold each segment (a wrong one would name another episode)
            found = [int(owners[k]) for k in todo]
            n, j = np.asarray(found, np.int64), np.asarray([js[k] for k in todo], np.int64)
            nxt = np.minimum(n + 1, len(t.episodes) - 1)
            end = np.where(n + 1 < len(t.episodes), t.episodes[nxt, SEGMENT].astype(np.int64), len(t.segments))
            if not ((j >= t.episodes[n, SEGMENT].astype(np.int64)) & (j < end)).all():
                raise ValueError("a segment is given an episode it does not belong to")
        per_frame = [t.columns[c] for c in PER_FRAME if c in t.columns]
        mine = [js[k] for k in todo]
        if PREFETCH <= len(todo) <= SCAN:  # a batch's segments at random: their rows read together, a part at a time
            for a in range(0, len(mine), PREFETCH_PART):  # (a part's blocks stay in a remote root's block cache)
                seg = t.segments[np.asarray(mine[a:a + PREFETCH_PART], np.int64)]
                prefetch(per_frame, seg[:, ROW].astype(np.int64), (seg[:, ROW] + seg[:, COUNT]).astype(np.int64))
                self._check(t, mine[a:a + PREFETCH_PART], found[a:a + PREFETCH_PART])
            return
        with scanning(per_frame) if len(todo) > SCAN else contextlib.nullcontext():
            self._check(t, mine, found)

    def _check(self, t: Tables, todo: list[int], found: list[int]) -> None:
        for j, n in zip(todo, found):
            shard = int(t.segments[j, SHARD])
            code = int(t.episodes[n, SCHEMA])
            least = self.step_bytes.get(code)
            if least is None:
                least = self.step_bytes[code] = indexv2.step_bytes(self.meta["schemas"][code])
            why = indexv2.frame_problem(t.columns, int(j), self.meta["shards"][shard]["bytes"], least)
            if not why and self.meta.get("layout") == "packed":  # a remote index's, read by range: not at open
                why = indexv2.packed_problem(t.columns, int(j), self.meta["shards"][shard]["bytes"])
            if why:
                raise IndexFormatError(f"{self.file} is damaged: episode {idcols.id_text(t.ids, n)!r} segment "
                                       f"{int(j) - int(t.episodes[n, SEGMENT])}: {why}; re-shard with "
                                       "write --overwrite")
            self.checked[j] = True
