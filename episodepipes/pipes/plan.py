"""Pure planning: which (episode, frame) items a pass reads, how they split over ranks, how many batches.

Everything here is a plain function of the index and the options, so lengths are known without I/O
and the split arithmetic can be property-tested on lists.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np

from episodepipes.index import Episode, EpisodeIndex
from episodepipes.index.v2 import FIRST, LENGTH

SAMPLINGS = ("even", "random")


class Item(NamedTuple):
    """One planned sample. ``valid=False`` marks padding that only keeps ranks even.

    Attributes:
        episode: the episode's id.
        frame: the frame's position in the episode, from 0.
        valid: False for a padding repeat of a real frame (it reaches the batch as ``valid=False``).
    """

    episode: str
    frame: int
    valid: bool = True


class Run(NamedTuple):
    """Consecutive items whose members are one contiguous byte range of one shard."""

    shard: int
    start: int
    end: int
    items: tuple[Item, ...]
    bounds: tuple[int, ...] = ()  # each item's start byte, then the run's end
    crcs: tuple[int | None, ...] = ()  # each item's crc32 (None: the index has none); empty: look them up


def choose_frames(length: int, k: int, *, sampling: str = "even", seed: int = 0, key: str = "") -> list[int]:
    """K distinct frames of an episode of ``length`` frames, sorted; all frames when ``k >= length``.

    ``even`` takes the centre of K equal slices; ``random`` draws from a generator seeded by
    ``(seed, crc32(key))`` so each episode's choice is independent of the others and of the order.
    """
    if k <= 0:
        raise ValueError(f"frames_per_episode={k} should be a positive int")
    if sampling not in SAMPLINGS:
        raise ValueError(f"sampling={sampling!r} should be one of {SAMPLINGS}")
    if k >= length:
        return list(range(length))
    if sampling == "even":
        return [(2 * i + 1) * length // (2 * k) for i in range(k)]
    rng = np.random.default_rng([seed, zlib.crc32(key.encode())])
    return sorted(int(f) for f in rng.choice(length, size=k, replace=False))


def metric_items(episodes: Sequence[Episode], k: int, *, sampling: str = "even", seed: int = 0) -> list[Item]:
    """The chosen frames of every episode, in index order (which is shard order, so reads go forward)."""
    return [Item(e.id, f) for e in episodes for f in choose_frames(e.length, k, sampling=sampling, seed=seed, key=e.id)]


def rank_items(ids: Sequence[str], lengths: Sequence[int] | np.ndarray, k: int, *, rank: int, world_size: int,
               sampling: str = "even", seed: int = 0) -> tuple[RankItems, int]:
    """``(split_even(metric_items(...), rank=rank, ...), len(metric_items(...)))``, planning only this rank's share.

    The chosen frames per episode are ``min(length, k)``, so where each episode's frames fall in the whole plan
    is a cumulative sum over the lengths (one int per episode, vectorised), and only the episodes overlapping
    this rank's contiguous block have their frames chosen (`choose_frames`), a chunk at a time when the reader
    gets there (`RankItems`). Every rank gets the items, padding and total that the whole plan split by
    `split_even` gives it.

    Args:
        ids, lengths: the episodes' ids and lengths, in index order.
        k: frames per episode.
        rank, world_size: this rank and the number of ranks.
        sampling, seed: as `choose_frames`.
    """
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or k <= 0:
        raise ValueError(f"frames_per_episode={k} should be a positive int")
    if sampling not in SAMPLINGS:
        raise ValueError(f"sampling={sampling!r} should be one of {SAMPLINGS}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} should be in [0, world_size={world_size})")
    lengths = np.asarray(lengths, np.int64).ravel()
    cum = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(np.minimum(lengths, k), out=cum[1:])
    n = int(cum[-1])
    if n == 0:
        return RankItems(_Share(ids, lengths, cum, k, sampling, seed, 0, 0, 0)), 0
    lo, hi = rank * n // world_size, (rank + 1) * n // world_size
    share = _Share(ids, lengths, cum, k, sampling, seed, lo, hi, per_rank(n, world_size))
    if hi == lo:  # a rank with no real item repeats the whole plan's item rank % n
        share.filler = rank % n
    return RankItems(share), n


CHUNK = 4096  # items chosen, or located in the index, at a time


class _Share:
    """A rank's block ``[lo, hi)`` of the whole metric plan, padded to ``size`` with repeats of item ``filler``
    (a position in the whole plan; by default the block's last): its frames chosen a `CHUNK` at a time, on use."""

    def __init__(self, ids: Sequence[str], lengths: np.ndarray, cum: np.ndarray, k: int, sampling: str, seed: int,
                 lo: int, hi: int, size: int) -> None:
        self.ids, self.lengths, self.cum, self.k, self.sampling, self.seed = ids, lengths, cum, k, sampling, seed
        self.lo, self.hi, self.size, self.filler = lo, hi, size, hi - 1
        self._chunks: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # the last chunks chosen

    def located(self, a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
        """(episode position, frame) of items ``a .. b`` of the whole plan, int64 arrays."""
        es, fs = [], []
        for c in range(a // CHUNK, -(-b // CHUNK)):
            e, f = self._chunk(c)
            at = c * CHUNK
            es.append(e[max(a - at, 0):b - at])
            fs.append(f[max(a - at, 0):b - at])
        return (np.concatenate(es), np.concatenate(fs)) if es else (np.zeros(0, np.int64), np.zeros(0, np.int64))

    def _chunk(self, c: int) -> tuple[np.ndarray, np.ndarray]:
        got = self._chunks.get(c)
        if got is not None:
            return got
        a, b = c * CHUNK, min((c + 1) * CHUNK, int(self.cum[-1]))
        cum = self.cum
        e0, e1 = int(np.searchsorted(cum, a, side="right")) - 1, int(np.searchsorted(cum, b, side="left"))
        lengths = self.lengths[e0:e1]
        take = np.minimum(lengths, self.k)
        eps = np.repeat(np.arange(e0, e1, dtype=np.int64), take)
        i = np.arange(len(eps), dtype=np.int64) - np.repeat(cum[e0:e1] - cum[e0], take)  # its rank in its episode
        if self.sampling == "even":  # choose_frames' rule, vectorised
            ln = np.repeat(lengths, take)
            frames = np.where(ln <= self.k, i, (2 * i + 1) * ln // (2 * self.k))
        else:
            frames = np.array([f for e in range(e0, e1) for f in choose_frames(
                int(self.lengths[e]), self.k, sampling=self.sampling, seed=self.seed, key=self.ids[e])], np.int64)
        cut = a - int(cum[e0])
        got = (eps[cut:cut + b - a], frames[cut:cut + b - a])
        self._chunks = {k: v for k, v in self._chunks.items() if k == c - 1}
        self._chunks[c] = got
        return got


class RankItems(Sequence[Item]):
    """`rank_items`' plan of a rank: a sequence of `Item` whose frames are chosen (and items made) on access, a
    `CHUNK` at a time, so building a metric pipe costs nothing per item and a pass plans as it reads.
    `located` gives a range of them as arrays (what `iter_runs` reads); a slice is a view."""

    def __init__(self, share: _Share, start: int = 0, stop: int | None = None) -> None:
        self._share, self._start = share, start
        self._stop = share.size if stop is None else stop

    def __len__(self) -> int:
        return self._stop - self._start

    def located(self, a: int, b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(episode position in ``ids``, frame, valid) of items ``a .. b`` of this sequence, as arrays."""
        sh = self._share
        a, b = self._start + a, self._start + min(b, len(self))
        real = max(min(b, sh.hi - sh.lo) - a, 0)
        e, f = sh.located(sh.lo + a, sh.lo + a + real)
        pad = b - a - real
        if pad > 0:
            pe, pf = sh.located(sh.filler, sh.filler + 1)
            e, f = np.concatenate([e, np.repeat(pe, pad)]), np.concatenate([f, np.repeat(pf, pad)])
        return e, f, np.arange(a, b) < sh.hi - sh.lo

    def numbers_of(self, positions: np.ndarray) -> np.ndarray | None:
        """The index's episode numbers of episode ``positions`` (in ``ids``), when ``ids`` knows them (a
        `episodepipes.pipes.chosen.Chosen`'s ids), else None."""
        of = getattr(self._share.ids, "numbers_of", None)
        return None if of is None else of(positions)

    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            a, b, step = i.indices(len(self))
            if step != 1:
                return list(self)[i]
            return RankItems(self._share, self._start + a, self._start + max(a, b))
        i = range(len(self))[i]
        e, f, ok = self.located(i, i + 1)
        return Item(self._share.ids[int(e[0])], int(f[0]), bool(ok[0]))

    def items(self, a: int, b: int) -> list[Item]:
        """Items ``a .. b`` as `Item` objects, made together."""
        e, f, ok = self.located(a, b)
        ids = self._share.ids
        names = {n: ids[n] for n in np.unique(e).tolist()}
        return [Item(names[x], y, v) for x, y, v in zip(e.tolist(), f.tolist(), ok.tolist())]

    def __iter__(self) -> Iterator[Item]:
        for a in range(0, len(self), CHUNK):
            yield from self.items(a, a + CHUNK)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and len(other) == len(self) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"<{len(self)} planned metric items>"


def per_rank(n: int, world_size: int) -> int:
    """Samples every rank yields, padding included."""
    return math.ceil(n / world_size)


def split_even(items: Sequence[Item], *, rank: int, world_size: int) -> list[Item]:
    """This rank's contiguous block of ``items``, padded to ``per_rank`` with ``valid=False`` repeats.

    Blocks differ in size by at most one, so padding is at most one sample per rank (when
    ``len(items) >= world_size``). A rank with no real item repeats ``items[rank % n]``.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} should be in [0, world_size={world_size})")
    n = len(items)
    if n == 0:
        return []
    lo, hi = rank * n // world_size, (rank + 1) * n // world_size
    mine = list(items[lo:hi])
    filler = mine[-1] if mine else items[rank % n]
    mine += [filler._replace(valid=False)] * (per_rank(n, world_size) - len(mine))
    return mine


def num_batches(n: int, batch_size: int, max_batches: int | None = None) -> int:
    """Batches of a pass over ``n`` samples (the last one may be short), capped at ``max_batches``."""
    if batch_size <= 0:
        raise ValueError(f"batch_size={batch_size} should be a positive int")
    full = math.ceil(n / batch_size)
    return full if max_batches is None else min(full, max_batches)


def video_items(episodes: Sequence[Episode], *, batch_size: int, max_batches: int) -> list[Item]:
    """The pinned episodes' frames in order, cut at ``max_batches * batch_size`` so nothing past the cap is read."""
    cap = batch_size * max_batches
    out: list[Item] = []
    for e in episodes:
        take = min(e.length, cap - len(out))
        out += [Item(e.id, f) for f in range(take)]
        if len(out) >= cap:
            break
    return out


def read_runs(index: EpisodeIndex, items: Sequence[Item]) -> list[Run]:
    """Group items into contiguous byte ranges, so a local reader does one seek and one read per run."""
    return list(iter_runs(index, items))


def iter_runs(index: EpisodeIndex, items: Sequence[Item]) -> Iterator[Run]:
    """`read_runs`, as the reader gets to them: a `CHUNK` of items located in the index at a time, vectorised
    (their episodes found by one search of the ids, their byte ranges and crc32 by one `EpisodeIndex.frame_ranges`
    of their rows), so the first run costs its chunk, not the plan. A run is not cut where a chunk ends."""
    cur: list[Item] = []
    starts: list[int] = []
    crcs: list[int | None] = []
    shard = end = -1
    for a in range(0, len(items), CHUNK):
        for it, s, b0, b1, c in zip(*_located(index, items, a, min(a + CHUNK, len(items)))):
            if cur and s == shard and b0 == end:
                cur.append(it)
                starts.append(b0)
                crcs.append(c)
                end = b1
                continue
            if cur:
                yield Run(shard, starts[0], end, tuple(cur), (*starts, end), tuple(crcs))
            cur, starts, crcs, shard, end = [it], [b0], [c], s, b1
    if cur:
        yield Run(shard, starts[0], end, tuple(cur), (*starts, end), tuple(crcs))


def _located(index: EpisodeIndex, items: Sequence[Item], a: int, b: int
             ) -> tuple[list[Item], list[int], list[int], list[int], list[int | None]]:
    """Items ``a .. b`` and their shard, start byte, end byte and crc32 (None without), as lists."""
    if isinstance(items, RankItems):
        part = items.items(a, b)
        e, frames, _ = items.located(a, b)
        numbers = items.numbers_of(e)
        if numbers is None:
            numbers = index.numbers([it.episode for it in part])
    else:
        part = list(items[a:b])
        numbers = index.numbers([it.episode for it in part])
        frames = np.fromiter((it.frame for it in part), np.int64, len(part))
    t = index.tables
    bad = numbers < 0
    if not bad.any():
        ep = t.episodes[numbers]
        bad = (frames < 0) | (frames >= ep[:, LENGTH].astype(np.int64))
    if bad.any():  # an unknown id or a frame past its episode: the episode's own error names it
        it = part[int(np.argmax(bad))]
        index.episode(it.episode).frame_range(it.frame)
        raise IndexError(f"frame {it.frame} is outside episode {it.episode!r}")  # what frame_range raised
    rows = ep[:, FIRST].astype(np.int64) + frames
    shard, start, end = index.frame_ranges(rows, numbers)
    crc = index.frame_crcs(rows)
    return (part, shard.tolist(), start.tolist(), end.tolist(),
            [None] * len(part) if crc is None else crc.tolist())


def shards_of(index: EpisodeIndex, items: Sequence[Item]) -> list[int]:
    """The shards a pass over ``items`` touches (for ``verify``)."""
    return sorted({r.shard for r in iter_runs(index, items)})
