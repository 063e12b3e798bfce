"""`Episode`: one episode of an index, made on first use from the index's tables, and the lazy list of them.

An index holds its episodes as rows of numpy tables (`episodepipes.index.v2`), so opening one costs nothing per
episode; this module is the object view of one row, built only when code asks for it, and its per-frame byte
ranges, checked on first use. `Episode` keeps ``episodepipes.index`` as its public module (docs/API.md, reprs and
pickles name it).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol, overload

import numpy as np

from episodepipes.index.records import ArraySpec, Camera, Segment
from episodepipes.index.tables import Tables


class Indexed(Protocol):
    """What an `Episode` reads of its index (an `EpisodeIndex`, which it holds so that a pickled episode travels
    with its index's path): the tables, the episode ids and the root. Named by what it reads, not by class, so this
    module does not import the index module that imports it."""

    @property
    def tables(self) -> Tables: ...

    @property
    def ids(self) -> Sequence[str]: ...

    @property
    def root(self) -> Path | str: ...


class Episode:
    """One episode: attributes, schema, and where each frame's bytes are.

    Made by the index on first use (`EpisodeIndex.episodes`), from its tables: episodes of one schema share
    their ``cameras`` and ``arrays`` dicts (treat them as read-only), and ``schema`` is that schema's number,
    so code that compares many episodes can compare schema numbers. ``number`` is the episode's position in
    the index, and ``rows`` its frame rows for the index's vectorised accessors (`EpisodeIndex.frame_ranges`).
    """

    __slots__ = ("id", "split", "length", "fps", "prompt", "cameras", "arrays", "schema", "number", "_ix", "_row",
                 "_segs")

    def __init__(self, index: Indexed, number: int) -> None:
        """Made by `EpisodeIndex.episodes`, not by hand.

        Args:
            index: the index whose tables describe the episode.
            number: its position in ``index.episodes``.
        """
        t = index.tables
        first, length, _, schema, split, prompt, fps = t.episodes[number].tolist()
        self.id: str = index.ids[number]
        self.split: str = t.splits[split]
        self.length: int = length
        self.fps: float = t.fps[fps]
        self.prompt: str = t.prompts[prompt]
        self.cameras: dict[str, Camera]
        self.arrays: dict[str, ArraySpec]
        self.cameras, self.arrays = t.schemas[schema]
        self.schema, self.number = schema, number
        self._ix, self._row = index, first
        self._segs: tuple[tuple[int, int, int], ...] | None = None

    @property
    def meta(self) -> dict[str, Any]:
        """The episode's attributes (raw ``meta.json`` keys, zarr attrs, LeRobot's ``robot_type``): flat JSON
        scalars, checked at open (`episodepipes.episode_attrs`); empty when the source had none."""
        return dict(self._ix.tables.episode_meta.get(self.number, {}))

    @property
    def rows(self) -> range:
        """The episode's frame rows in the index's per-frame columns (frame ``t`` is row ``rows[t]``)."""
        return range(self._row, self._row + self.length)

    def _segment(self, frame: int) -> tuple[int, int, int]:
        if not 0 <= frame < self.length:
            raise IndexError(f"frame {frame} is outside episode {self.id!r} of length {self.length}")
        if self._segs is None:
            self._segs = self._ix.tables.episode_segments(self.number)
        for seg in self._segs:
            if frame < seg[1] + seg[2]:
                return seg
        raise IndexError(f"frame {frame} is in no segment of episode {self.id!r}")  # the tables tile: unreachable

    def frame_range(self, frame: int) -> tuple[int, int, int]:
        """(shard index, start byte, end byte) of one frame's members.

        Args:
            frame: the frame's position in the episode, ``0 <= frame < length``; others raise IndexError.
        """
        shard = self._segment(frame)[0]
        row, t = self._row + frame, self._ix.tables
        a = int(t.offset[row])
        return shard, a, a + int(t.size[row])

    def frame_crc(self, frame: int) -> int | None:
        """``zlib.crc32`` of the bytes `frame_range` gives, or None when the index has no checksums.

        Args:
            frame: the frame's position in the episode, ``0 <= frame < length``; others raise IndexError.
        """
        self._segment(frame)
        crc = self._ix.tables.crc
        return None if crc is None else int(crc[self._row + frame])

    @property
    def segments(self) -> tuple[Segment, ...]:
        """The runs of frames in each shard, with every offset (built on each call: per-frame tuples)."""
        self._segment(0)
        t, out = self._ix.tables, []
        for shard, first, count in self._segs or ():
            r = self._row + first
            offs = t.offset[r:r + count]
            crc = None if t.crc is None else tuple(t.crc[r:r + count].tolist())
            end = int(offs[-1]) + int(t.size[r + count - 1])
            out.append(Segment(shard, first, count, tuple(offs.tolist()), end, crc))
        return tuple(out)

    @property
    def nbytes(self) -> int:
        """The bytes of all the episode's frames in the shards (tar headers included)."""
        self._segment(0)
        return int(self._ix.tables.size[self._row:self._row + self.length].sum(dtype=np.uint64))

    def _key(self) -> tuple:
        return (self.id, self.split, self.length, self.fps, self.prompt, self.cameras, self.arrays, self.segments,
                self.meta)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Episode) and (other is self or self._key() == other._key())

    def __hash__(self) -> int:
        return hash(self.id)

    def __repr__(self) -> str:
        return (f"Episode(id={self.id!r}, split={self.split!r}, length={self.length}, fps={self.fps}, "
                f"prompt={self.prompt!r}, cameras={self.cameras!r}, arrays={self.arrays!r})")


class LazyEpisodes(Sequence):
    """`EpisodeIndex.episodes`: a list-like view that makes each `Episode` on first access."""

    def __init__(self, index: Indexed) -> None:
        self._ix = index
        self._n = len(index.ids)
        self._made: dict[int, Episode] = {}  # only the episodes asked for: nothing per episode at open

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, i: int) -> Episode: ...
    @overload
    def __getitem__(self, i: slice) -> list[Episode]: ...

    def __getitem__(self, i: int | slice) -> Episode | list[Episode]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(self._n))]
        n = range(self._n)[i]  # IndexError, negative indexes and numpy integers as a list has them
        e = self._made.get(n)
        if e is None:
            e = self._made[n] = Episode(self._ix, n)
        return e

    def __iter__(self) -> Iterator[Episode]:
        return (self[k] for k in range(self._n))

    def __repr__(self) -> str:
        return f"<{len(self)} episodes of {self._ix.root}>"


Episode.__module__ = "episodepipes.index"  # its public path since it was first written (see indexrecords)
