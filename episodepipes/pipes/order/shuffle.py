"""Pure epoch planning for training: a seeded permutation of every frame, split evenly over ranks.

The order of an epoch is a function of ``(seed, epoch)`` alone, so the resume state is a cursor
``(epoch, position)`` and the order is recomputed from it rather than stored. Ranks take strided
slices of the same permutation, so before trimming their union is every frame exactly once; each
rank then keeps the same whole number of batches (``batches_per_epoch``), dropping at most
``world_size * batch_size - 1`` frames per epoch, a different set every epoch.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import json
from collections.abc import Sequence

import numpy as np

from episodepipes.pipes.plan import Item


def batches_per_epoch(n: int, *, world_size: int, batch_size: int) -> int:
    """Full batches every rank yields per epoch over ``n`` frames (drop-last, equal on every rank)."""
    if batch_size <= 0:
        raise ValueError(f"batch_size={batch_size} should be a positive int")
    if world_size <= 0:
        raise ValueError(f"world_size={world_size} should be a positive int")
    return n // (world_size * batch_size)


def epoch_seed(seed: int, epoch: int) -> np.random.SeedSequence:
    """The epoch's own seed sequence: independent streams per epoch, the same on every rank."""
    if seed < 0 or epoch < 0:
        raise ValueError(f"seed={seed} and epoch={epoch} should be non-negative ints")
    return np.random.SeedSequence(seed, spawn_key=(epoch,))


def epoch_permutation(n: int, *, seed: int, epoch: int) -> np.ndarray:
    """A permutation of ``range(n)`` (int64) drawn from ``epoch_seed(seed, epoch)``."""
    return np.random.default_rng(epoch_seed(seed, epoch)).permutation(n)


def rank_slice(perm: np.ndarray, *, rank: int, world_size: int) -> np.ndarray:
    """This rank's untrimmed share of ``perm``: every ``world_size``-th entry from ``rank``."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} should be in [0, world_size={world_size})")
    return perm[rank::world_size]


def rank_order(n: int, *, seed: int, epoch: int, rank: int, world_size: int, batch_size: int) -> np.ndarray:
    """The flat frame numbers this rank reads in ``epoch``, trimmed to whole, equal batches."""
    keep = batches_per_epoch(n, world_size=world_size, batch_size=batch_size) * batch_size
    return rank_slice(epoch_permutation(n, seed=seed, epoch=epoch), rank=rank, world_size=world_size)[:keep]


class FrameTable:
    """Flat frame numbers ``0..n-1`` over episodes in order, and back to `Item` (episode, frame)."""

    def __init__(self, ids: Sequence[str], lengths: Sequence[int]) -> None:
        if len(ids) != len(lengths):
            raise ValueError(f"{len(ids)} episode ids but {len(lengths)} lengths")
        self.ids = list(ids)
        self.starts = [0, *itertools.accumulate(int(n) for n in lengths)]  # a list: bisect beats numpy per lookup

    def __len__(self) -> int:
        return self.starts[-1]

    def fingerprint(self) -> str:
        """A digest of the episode ids and lengths in order: what every epoch's order depends on besides the seed
        (re-sharding the same episodes keeps it, another episode list or length changes it)."""
        lengths = [b - a for a, b in itertools.pairwise(self.starts)]
        return hashlib.sha256(json.dumps([self.ids, lengths]).encode()).hexdigest()[:16]

    def locate(self, flat: int) -> tuple[int, int]:
        """(episode position, frame) of a flat frame number."""
        if not 0 <= flat < len(self):
            raise IndexError(f"frame number {flat} is outside [0, {len(self)})")
        e = bisect.bisect_right(self.starts, flat) - 1
        return e, flat - self.starts[e]

    def item(self, flat: int) -> Item:
        e, f = self.locate(flat)
        return Item(self.ids[e], f)
