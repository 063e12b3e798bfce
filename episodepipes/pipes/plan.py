"""Pure planning: which (episode, frame) items a pass reads, how they split over ranks, how many batches.

Everything here is a plain function of the index and the options, so lengths are known without I/O
and the split arithmetic can be property-tested on lists.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from episodepipes.index import Episode, EpisodeIndex

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
               sampling: str = "even", seed: int = 0) -> tuple[list[Item], int]:
    """``(split_even(metric_items(...), rank=rank, ...), len(metric_items(...)))``, planning only this rank's share.

    The chosen frames per episode are ``min(length, k)``, so where each episode's frames fall in the whole plan
    is a cumulative sum over the lengths (one int per episode, vectorised), and only the episodes overlapping
    this rank's contiguous block have their frames chosen (`choose_frames`). Every rank gets the items, padding
    and total that the whole plan split by `split_even` gives it, at a cost proportional to its share.

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
        return [], 0

    def items_of(e: int) -> list[Item]:
        return [Item(ids[e], f) for f in choose_frames(int(lengths[e]), k, sampling=sampling, seed=seed, key=ids[e])]

    lo, hi = rank * n // world_size, (rank + 1) * n // world_size
    mine: list[Item] = []
    if hi > lo:
        e0, e1 = int(np.searchsorted(cum, lo, side="right")) - 1, int(np.searchsorted(cum, hi, side="left"))
        for e in range(e0, e1):
            mine += items_of(e)
        mine = mine[lo - int(cum[e0]):hi - int(cum[e0])]
    if mine:
        filler = mine[-1]
    else:  # a rank with no real item repeats the whole plan's item rank % n
        g = rank % n
        e = int(np.searchsorted(cum, g, side="right")) - 1
        filler = items_of(e)[g - int(cum[e])]
    return mine + [filler._replace(valid=False)] * (per_rank(n, world_size) - len(mine)), n


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
    runs: list[Run] = []
    cur: list[Item] = []
    starts: list[int] = []
    shard = end = -1
    for it in items:
        s, a, b = index.episode(it.episode).frame_range(it.frame)
        if cur and s == shard and a == end:
            cur.append(it)
            starts.append(a)
            end = b
            continue
        if cur:
            runs.append(Run(shard, starts[0], end, tuple(cur), (*starts, end)))
        cur, starts, shard, end = [it], [a], s, b
    if cur:
        runs.append(Run(shard, starts[0], end, tuple(cur), (*starts, end)))
    return runs


def shards_of(index: EpisodeIndex, items: Sequence[Item]) -> list[int]:
    """The shards a pass over ``items`` touches (for ``verify``)."""
    return sorted({r.shard for r in read_runs(index, items)})
