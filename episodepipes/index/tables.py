"""`Tables`: an index's tables as one read-only value, what the code around `EpisodeIndex` reads them through.

`Episode`, the statistics, the v1 layout, verify, ``info`` and ``upgrade`` take this value (`EpisodeIndex.tables`)
instead of reaching into the index's private attributes, so the index can change how it holds its tables without
breaking them. It is a thin view: its fields are the index's own arrays (a v2 index's memory-mapped columns), never
copies, and nothing in it is made per episode or per frame. A v2 index's per-frame values are checked per segment
on first use (`check_segments`), as they always were.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from episodepipes.index import v2 as indexv2
from episodepipes.index.check import IndexFormatError
from episodepipes.index.records import ArraySpec, Camera, dtype_str, read_camera
from episodepipes.index.v2 import FIRST, SCHEMA, SEGMENT, SHARD

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
        episode_meta: episode number -> its attributes, only for the episodes that have some.
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
    _checks: _SegmentChecks = field(repr=False)

    @classmethod
    def of(cls, meta: dict, cols: dict[str, np.ndarray], checked: np.ndarray, file: Path | str) -> Tables:
        """The tables of a checked index: ``meta`` its v2 metadata, ``cols`` its columns (held, not copied),
        ``checked`` which segments' frames are already checked (a v1 index checks all at open)."""
        schemas = [({n: read_camera(n, c) for n, c in sc["cameras"].items()},
                    {n: ArraySpec(n, dtype_str(a["dtype"]), tuple(a["shape"]), a.get("source", n))
                     for n, a in sc["arrays"].items()}) for sc in meta["schemas"]]
        return cls(cols["episodes"], cols["segments"], cols["offset"], cols["size"], cols.get("crc32"),
                   cols, meta["splits"], meta["prompts"], [float(x) for x in meta["fps"]],
                   schemas, {n: m for n, m in meta["episode_meta"]}, _SegmentChecks(meta, checked, file))

    def check_segments(self, js: Iterable[int]) -> None:
        """Check the per-frame values of segments ``js`` before any of them is used to slice a shard (v2 checks them
        on first use), raising `IndexFormatError` naming the file, episode and segment.

        Args:
            js: segment numbers, rows of `segments`.
        """
        self._checks.check(self, js)

    def episode_segments(self, n: int) -> tuple[tuple[int, int, int], ...]:
        """(shard, first frame, count) of each of episode ``n``'s segments, their frames checked.

        Args:
            n: an episode number, a row of `episodes`.
        """
        j0 = int(self.episodes[n, SEGMENT])
        j1 = int(self.episodes[n + 1, SEGMENT]) if n + 1 < len(self.episodes) else len(self.segments)
        self.check_segments(range(j0, j1))
        first = int(self.episodes[n, FIRST])
        return tuple((s, r - first, c) for s, r, c in self.segments[j0:j1].tolist())


class _SegmentChecks:
    """Which segments' frames are checked, and what the check needs from the index's metadata (messages name
    ``file``); the one mutable part of `Tables`."""

    def __init__(self, meta: dict, checked: np.ndarray, file: Path | str) -> None:
        self.meta, self.checked, self.file = meta, checked, file
        self.step_bytes: dict[int, int] = {}  # schema code -> bytes of one step of its arrays

    def check(self, t: Tables, js: Iterable[int]) -> None:
        for j in js:
            if not self.checked[j]:
                shard = int(t.segments[j, SHARD])
                n = int(np.searchsorted(t.episodes[:, SEGMENT], j, side="right")) - 1
                code = int(t.episodes[n, SCHEMA])
                least = self.step_bytes.get(code)
                if least is None:
                    least = self.step_bytes[code] = indexv2.step_bytes(self.meta["schemas"][code])
                why = indexv2.frame_problem(t.columns, int(j), self.meta["shards"][shard]["bytes"], least)
                if why:
                    raise IndexFormatError(f"{self.file} is damaged: episode {self.meta['ids'][n]!r} segment "
                                           f"{int(j) - int(t.episodes[n, SEGMENT])}: {why}; re-shard with "
                                           "write --overwrite")
                self.checked[j] = True
