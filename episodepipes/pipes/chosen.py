"""`Chosen`: the episodes a train or metric pipe reads, as columns of the index's tables, not one object each.

At a million episodes, a list of `Episode` objects costs seconds and hundreds of MB per rank before the first
batch. A pipe needs only a few columns of them at build time (lengths, first frame rows, schema codes, the shard
runs the frames lie in), which the index's mapped tables give vectorised; an `Episode` is made (by the index, on
first use) only when a frame of it is read. ``Chosen`` is a sequence of `Episode` for the code that reads them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import overload

import numpy as np

from episodepipes.index import Episode, EpisodeIndex
from episodepipes.index.columns import release
from episodepipes.index.idcols import IdList
from episodepipes.index.v2 import COUNT, FIRST, LENGTH, SCHEMA, SEGMENT, SHARD
from episodepipes.pipes.select import Where, select

_CHUNK = 1 << 16  # episodes `Chosen.runs` takes at a time
_FEW = 64  # schemas up to which `Chosen.schemas` scans the column once per schema


class _Ids(Sequence[str]):
    """The ids of some of an index's episodes, looked up on access (slices give lists)."""

    def __init__(self, ids: Sequence[str], chosen: Chosen) -> None:
        self._ids, self._chosen = ids, chosen

    def __len__(self) -> int:
        return len(self._chosen)

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...

    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            a, b, step = i.indices(len(self))
            span = self._chosen.span
            if span is not None and step == 1 and isinstance(self._ids, list):
                return self._ids[span[0] + a:span[0] + max(a, b)]  # consecutive episodes: a slice of the list
            return [self._ids[n] for n in self._chosen.numbers[i].tolist()]
        return self._ids[self._chosen.number(i)]

    def numbers_of(self, positions: np.ndarray) -> np.ndarray:
        """The index's episode numbers of the ids at ``positions``, vectorised."""
        return self._chosen.numbers_of(positions)

    def raw(self, a: int, b: int) -> np.ndarray | None:
        """Ids ``a .. b`` as the index's id column holds them (``|S<width>``, `IdList.raw`), or None where the
        index's ids are not such a column."""
        if not isinstance(self._ids, IdList):
            return None
        span = self._chosen.span
        if span is not None:
            return self._ids.raw(slice(span[0] + a, span[0] + min(b, len(self))))
        return self._ids.raw(self._chosen.numbers[a:b])


class Chosen(Sequence[Episode]):
    """Episodes ``numbers`` (ascending positions in ``index.episodes``), with their columns as arrays.

    Attributes:
        index: the index.
        numbers: the episodes' numbers (int64).
        lengths: their lengths (int64).
        firsts: their first frame rows (int64; a view where they are consecutive).
        span: ``(first, end)`` numbers where the episodes are consecutive, else None.
        ids: their ids, looked up on access.
    """

    def __init__(self, index: EpisodeIndex, numbers: np.ndarray) -> None:
        self.index = index
        numbers = np.asarray(numbers, np.int64)
        n = len(numbers)
        # consecutive episodes (a whole split, usually): held as a span, and columns are views of the mapped table
        consecutive = n > 0 and numbers[-1] - numbers[0] == n - 1 and (n == 1 or bool((np.diff(numbers) == 1).all()))
        self.span = (int(numbers[0]), int(numbers[-1]) + 1) if consecutive else None
        self._numbers = None if consecutive else numbers
        self._n = n
        first = self.column(FIRST)  # frame rows fit int64 (the index bounds them): a view, not a copy
        self.firsts = first.view(np.int64) if first.dtype == np.dtype(np.uint64) else first.astype(np.int64)
        self.ids = _Ids(index.ids, self)

    @property
    def numbers(self) -> np.ndarray:
        """The episodes' numbers (int64; made on each call for a span)."""
        return self._numbers if self.span is None else np.arange(*self.span, dtype=np.int64)

    def number(self, i: int) -> int:
        """The number of the ``i``-th episode."""
        if self.span is None:
            return int(self._numbers[i])
        return range(*self.span)[i]

    def numbers_of(self, positions: np.ndarray) -> np.ndarray:
        """The numbers (int64) of the episodes at ``positions`` among these, vectorised."""
        positions = np.asarray(positions, np.int64)
        return positions + self.span[0] if self.span is not None else self._numbers[positions]

    def _slice(self, a: int, b: int) -> np.ndarray:
        return np.arange(self.span[0] + a, self.span[0] + min(b, self._n), dtype=np.int64) if self.span else \
            self._numbers[a:b]

    def column(self, k: int) -> np.ndarray:
        """Column ``k`` of the index's episodes table (`episodepipes.index.v2`'s ``LENGTH``, ...) for these
        episodes, uint64: a view of the table where they are consecutive."""
        table = self.index.tables.episodes
        return table[self.span[0]:self.span[1], k] if self.span else table[self._numbers, k]

    @property
    def lengths(self) -> np.ndarray:
        """The episodes' lengths (uint64; a view where they are consecutive)."""
        return self.column(LENGTH)

    @classmethod
    def of(cls, index: EpisodeIndex, episodes: Sequence[Episode]) -> Chosen:
        """``episodes`` (of ``index``) as `Chosen`; a `Chosen` is kept as it is."""
        if isinstance(episodes, Chosen):
            return episodes
        return cls(index, np.array([e.number for e in episodes], np.int64))

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, i: int) -> Episode: ...
    @overload
    def __getitem__(self, i: slice) -> list[Episode]: ...

    def __getitem__(self, i: int | slice) -> Episode | list[Episode]:
        if isinstance(i, slice):
            return [self.index.episodes[n] for n in self.numbers[i].tolist()]
        return self.index.episodes[self.number(i)]

    def schemas(self) -> list[Episode]:
        """The first episode of each schema among these, in order (what a check of their keys compares)."""
        codes = self.column(SCHEMA)
        if len(self.index.tables.schemas) > _FEW:
            firsts = np.unique(codes, return_index=True)[1]
        else:  # a few schemas: a pass per schema beats sorting a copy of the column
            firsts = np.array([int(np.argmax(hit)) for c in range(len(self.index.tables.schemas))
                               if (hit := codes == c).any()], np.int64)
        return [self[int(i)] for i in np.sort(firsts)]

    def runs(self) -> tuple[np.ndarray, np.ndarray]:
        """(run bounds, shard of each run) of these episodes' frames in flat order (episode after episode): a run
        is a maximal range of frames of one shard, so its bytes go forward through that shard. From the segments
        table, a chunk of episodes at a time: O(runs) kept, nothing per frame."""
        t = self.index.tables
        seg_first = t.episodes[:, SEGMENT]
        bounds, shards = [np.zeros(1, np.int64)], [np.zeros(0, np.int64)]
        last, at = -1, 0
        for a in range(0, len(self), _CHUNK):
            nums = self._slice(a, a + _CHUNK)
            j0 = seg_first[nums].astype(np.int64)
            nxt = nums + 1
            j1 = np.where(nxt < len(seg_first), seg_first[np.minimum(nxt, len(seg_first) - 1)].astype(np.int64),
                          len(t.segments))
            counts = j1 - j0
            seg = np.repeat(j0 - np.concatenate([[0], np.cumsum(counts)[:-1]]), counts) + np.arange(
                int(counts.sum()), dtype=np.int64)
            shard = t.segments[seg, SHARD].astype(np.int64)
            ends = at + np.cumsum(t.segments[seg, COUNT].astype(np.int64))
            if len(seg):  # read once: the rows' pages go back to the page cache (`release`)
                release(t.episodes[int(nums[0]):int(nums[-1]) + 2], t.segments[int(seg[0]):int(seg[-1]) + 1])
            if len(shard):
                cut = np.flatnonzero(np.concatenate([[shard[0] != last], shard[1:] != shard[:-1]]))
                starts = np.concatenate([[at], ends[:-1]])[cut]
                bounds.append(starts[starts > 0])
                shards.append(shard[cut])
                last, at = int(shard[-1]), int(ends[-1])
        total = int(self.lengths.sum(dtype=np.uint64))
        if at != total:
            raise ValueError(f"the segments of {self.index.root}'s episodes hold {at} frames but their lengths "
                             f"{total}; re-shard it (write --overwrite)")
        return np.concatenate([*bounds, [at]]).astype(np.int64), np.concatenate(shards)


def choose(idx: EpisodeIndex, split: str, *, episodes: Sequence[str] | None = None,
           where: Where | None = None) -> Chosen:
    """`select`'s episodes as `Chosen`: without ``episodes`` and ``where``, straight from the split's numbers
    (no `Episode` made); with them, `select` decides (its errors and order) and only their numbers are kept."""
    if episodes is None and where is None:
        numbers = idx.split_numbers(split)
        if len(numbers):
            return Chosen(idx, numbers)
    return Chosen.of(idx, select(idx, split, episodes=episodes, where=where))
