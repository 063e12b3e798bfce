"""The block shuffle: an epoch order that visits runs of consecutive frames of one shard, as whole blocks.

A full shuffle sends each sample to a random place of the dataset, so an object store pays one request per
frame. The block order (MosaicML Streaming's shuffle blocks, LitData's chunks) instead cuts the frames, in
index order (contiguous byte ranges within a shard), into blocks of at most ``block_frames`` consecutive
frames of one shard; permutes the blocks (keyed by ``(seed, epoch)``); and shuffles the frames of each
consecutive group of ``window_blocks`` blocks (a window) among themselves (keyed by ``(seed, epoch,
window)``). A reader can then fetch a block's bytes once, when the order first touches its window.

The order is a bijection of ``[0, n)`` and a pure function of the layout, ``seed`` and ``epoch`` (nothing
per frame is stored; the per-epoch tables are O(number of blocks)), so `permute`'s elastic global stream,
drop-last and rank deal apply to it unchanged: position ``p`` of the stream is frame ``order(p)``.
"""

from __future__ import annotations

import hashlib
import itertools
from functools import cached_property

import numpy as np

from episodepipes.pipes.order.permute import IndexShuffle

_BLOCKS, _WINDOW = (1 << 31) + 1, (1 << 31) + 2  # stream tags of the block and window shuffles
DEFAULT_BLOCK_FRAMES, DEFAULT_WINDOW_BLOCKS = 64, 8


def check_count(name: str, value: object) -> int:
    """``value`` as an int >= 1, or a ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ValueError(f"{name}={value!r} should be an int >= 1")
    return int(value)


def block_bounds(shards: np.ndarray, block_frames: int) -> np.ndarray:
    """Block boundaries (``starts`` then ``n``, int64) over frames whose shards are ``shards`` in flat order.

    A block ends where the shard changes and after ``block_frames`` frames of one run, so each block's
    frames lie in one shard.
    """
    shards = np.asarray(shards).ravel()
    n = len(shards)
    runs = [0, *(np.flatnonzero(np.diff(shards)) + 1).tolist(), n]
    parts = [np.arange(a, b, block_frames, dtype=np.int64) for a, b in itertools.pairwise(runs) if b > a]
    return np.concatenate([*parts, np.array([n], np.int64)])


class BlockLayout:
    """The blocks of a frame table (boundaries from `block_bounds`) and how many make a window."""

    def __init__(self, bounds: np.ndarray, *, block_frames: int, window_blocks: int) -> None:
        self.bounds = np.asarray(bounds, np.int64)
        if self.bounds.ndim != 1 or len(self.bounds) < 1 or self.bounds[0] != 0 or (np.diff(self.bounds) <= 0).any():
            raise ValueError("block bounds should start at 0 and increase")
        self.block_frames = check_count("block_frames", block_frames)
        self.window_blocks = check_count("window_blocks", window_blocks)
        self.bounds.flags.writeable = False

    @property
    def n(self) -> int:
        return int(self.bounds[-1])

    @property
    def blocks(self) -> int:
        return len(self.bounds) - 1

    @cached_property
    def fingerprint(self) -> str:
        """A digest of the block boundaries: the order follows the shards, so a re-sharded dataset differs."""
        return hashlib.sha256(self.bounds.tobytes()).hexdigest()[:16]

    def describe(self) -> dict[str, object]:
        """What a saved state records of the order (`train_state.SHUFFLE`)."""
        return {"shuffle": "block", "block_frames": self.block_frames, "window_blocks": self.window_blocks,
                "blocks": self.fingerprint}

    def order(self, *, seed: int, epoch: int) -> BlockOrder:
        return BlockOrder(self, seed=seed, epoch=epoch)


class BlockOrder:
    """Epoch ``epoch``'s block order: ``order(positions)`` -> frames, like `IndexShuffle`'s call.

    Attributes:
        layout: the blocks.
        windows: the number of windows (the last may hold fewer blocks).
    """

    def __init__(self, layout: BlockLayout, *, seed: int, epoch: int) -> None:
        self.layout, self.seed, self.epoch = layout, int(seed), int(epoch)
        nb, m = layout.blocks, layout.window_blocks
        sizes = np.diff(layout.bounds)
        self._slots = IndexShuffle.of(nb, seed=seed, epoch=epoch, stream=(_BLOCKS,))(np.arange(nb, dtype=np.int64))
        self._at = np.concatenate([[0], np.cumsum(sizes[self._slots])]).astype(np.int64)  # slot k's first position
        self._win = np.concatenate([self._at[:-1:m], [layout.n]]).astype(np.int64)  # window w's first position
        self.windows = len(self._win) - 1

    def __len__(self) -> int:
        return self.layout.n

    def window_of(self, positions: np.ndarray | int) -> np.ndarray:
        """The window of each stream position (int64, the shape of ``positions``)."""
        p = np.asarray(positions, np.int64)
        if p.size and (p.min() < 0 or p.max() >= self.layout.n):
            raise IndexError(f"positions should be in [0, {self.layout.n})")
        return np.searchsorted(self._win, p, side="right") - 1

    def __call__(self, positions: np.ndarray | int) -> np.ndarray:
        """The frame at each stream position (int64, the shape of ``positions``)."""
        p = np.asarray(positions, np.int64)
        w = self.window_of(p)
        r = np.empty_like(p)
        for win in np.unique(w).tolist():  # a batch spans one or two windows
            at = w == win
            start, size = self._win[win], self._win[win + 1] - self._win[win]
            shuffle = IndexShuffle.of(int(size), seed=self.seed, epoch=self.epoch, stream=(_WINDOW, win))
            r[at] = start + shuffle(p[at] - start)
        k = np.searchsorted(self._at, r, side="right") - 1  # the slot r falls in, then its block's frame
        return self.layout.bounds[self._slots[k]] + (r - self._at[k])

    def window_blocks(self, window: int) -> list[tuple[int, int]]:
        """``[(first frame, end frame)]`` of each block of ``window``, in slot order."""
        if not 0 <= window < self.windows:
            raise IndexError(f"window {window} should be in [0, {self.windows})")
        m, b = self.layout.window_blocks, self.layout.bounds
        return [(int(b[s]), int(b[s + 1])) for s in self._slots[window * m:(window + 1) * m].tolist()]

    def start(self, window: int) -> int:
        """The first stream position of ``window`` (``start(windows)`` is ``n``)."""
        return int(self._win[window])
