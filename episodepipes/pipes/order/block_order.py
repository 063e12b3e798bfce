"""The block shuffle: an epoch order that visits runs of consecutive frames of one shard, as whole blocks.

A full shuffle sends each sample to a random place of the dataset, so an object store pays one request per
frame. The block order (MosaicML Streaming's shuffle blocks, LitData's chunks) instead cuts the frames, in
index order (contiguous byte ranges within a shard), into blocks of at most ``block_frames`` consecutive
frames of one shard; permutes the blocks (keyed by ``(seed, epoch)``); and shuffles the frames of each
consecutive group of ``window_blocks`` blocks (a window) among themselves (keyed by ``(seed, epoch,
window)``). A reader can then fetch a block's bytes once, when the order first touches its window.

Nothing per frame or per block is stored: the layout is the *runs* (maximal ranges of frames of one shard, about
one per shard or episode), each cut into blocks of ``block_frames`` whose last one may be short (a *tail*). The
block permutation is an `IndexShuffle` (a Feistel network, evaluated on demand), and where the blocks land in the
stream follows from the tails alone: slot ``k`` (the ``k``-th block of the epoch) starts at ``k * block_frames``
less the shortfall of the tails in slots before it, so a position finds its slot by a binary search over the
tails (`BlockOrder.slots`). An epoch's order costs O(runs) to make and O(log runs) per position, and is the
same bijection of ``[0, n)`` as a materialised table of the blocks would give, so `permute`'s elastic global stream,
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
_CHUNK = 1 << 14  # blocks hashed at a time by `BlockLayout.fingerprint`


def check_count(name: str, value: object) -> int:
    """``value`` as an int >= 1, or a ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ValueError(f"{name}={value!r} should be an int >= 1")
    return int(value)


def run_bounds(shards: np.ndarray) -> np.ndarray:
    """Run boundaries (``starts`` then ``n``, int64) of frames whose shards are ``shards`` in flat order: a run
    ends where the shard changes."""
    shards = np.asarray(shards).ravel()
    return np.concatenate([[0], np.flatnonzero(np.diff(shards)) + 1, [len(shards)]]).astype(np.int64)


def block_bounds(shards: np.ndarray, block_frames: int) -> np.ndarray:
    """Block boundaries (``starts`` then ``n``, int64) over frames whose shards are ``shards`` in flat order:
    a block ends where the shard changes and after ``block_frames`` frames of one run (materialised: for tests
    and small layouts; `BlockLayout` never makes them)."""
    runs = run_bounds(shards).tolist()
    parts = [np.arange(a, b, block_frames, dtype=np.int64) for a, b in itertools.pairwise(runs) if b > a]
    return np.concatenate([*parts, np.array([runs[-1]], np.int64)])


class BlockLayout:
    """The blocks of a frame table and how many make a window, held as runs: O(runs), never O(blocks).

    ``BlockLayout(bounds, ...)`` takes block boundaries (every block at most ``block_frames`` long: a run ends
    after each shorter block); `BlockLayout.of_runs` takes the runs themselves.
    """

    def __init__(self, bounds: np.ndarray, *, block_frames: int, window_blocks: int) -> None:
        bounds = np.asarray(bounds, np.int64)
        sizes = np.diff(bounds)
        if bounds.ndim != 1 or len(bounds) < 1 or bounds[0] != 0 or (sizes <= 0).any():
            raise ValueError("block bounds should start at 0 and increase")
        block_frames = check_count("block_frames", block_frames)
        if (sizes > block_frames).any():
            raise ValueError(f"block bounds should cut blocks of at most block_frames={block_frames} frames")
        ends = bounds[1:][sizes < block_frames]  # a short block ends its run
        runs = np.unique(np.concatenate([[0], ends, bounds[-1:]]))
        self._set(runs, block_frames, window_blocks)

    @classmethod
    def of_runs(cls, runs: np.ndarray, *, block_frames: int, window_blocks: int) -> BlockLayout:
        """The layout of runs ``runs`` (starts then ``n``, increasing), each cut into blocks of ``block_frames``."""
        runs = np.asarray(runs, np.int64)
        if runs.ndim != 1 or len(runs) < 1 or runs[0] != 0 or (np.diff(runs) <= 0).any():
            raise ValueError("run bounds should start at 0 and increase")
        out = cls.__new__(cls)
        out._set(runs, check_count("block_frames", block_frames), window_blocks)
        return out

    def _set(self, runs: np.ndarray, block_frames: int, window_blocks: int) -> None:
        self.block_frames = check_count("block_frames", block_frames)
        self.window_blocks = check_count("window_blocks", window_blocks)
        self.runs = runs
        lengths = np.diff(runs)
        self.first_block = np.concatenate([[0], np.cumsum(-(-lengths // self.block_frames))]).astype(np.int64)
        short = lengths % self.block_frames
        tails = np.flatnonzero(short)
        self.tails = self.first_block[tails + 1] - 1  # the short blocks, ascending
        self.tail_sizes = short[tails].astype(np.int64)
        for a in (self.runs, self.first_block, self.tails, self.tail_sizes):
            a.flags.writeable = False

    @property
    def n(self) -> int:
        return int(self.runs[-1])

    @property
    def blocks(self) -> int:
        return int(self.first_block[-1])

    def block_start(self, blocks: np.ndarray | int) -> np.ndarray:
        """The first frame of each block (int64, the shape of ``blocks``)."""
        b = np.asarray(blocks, np.int64)
        r = np.searchsorted(self.first_block, b, side="right") - 1
        return self.runs[r] + (b - self.first_block[r]) * self.block_frames

    def block_end(self, blocks: np.ndarray | int) -> np.ndarray:
        """The frame after each block's last (int64, the shape of ``blocks``)."""
        b = np.asarray(blocks, np.int64)
        r = np.searchsorted(self.first_block, b, side="right") - 1
        return np.minimum(self.runs[r] + (b - self.first_block[r] + 1) * self.block_frames, self.runs[r + 1])

    def block_of(self, frames: np.ndarray | int) -> np.ndarray:
        """The block holding each frame (int64, the shape of ``frames``)."""
        f = np.asarray(frames, np.int64)
        r = np.searchsorted(self.runs, f, side="right") - 1
        return self.first_block[r] + (f - self.runs[r]) // self.block_frames

    @property
    def bounds(self) -> np.ndarray:
        """Every block boundary (starts then ``n``), materialised: O(blocks), for tests and inspection."""
        return np.append(self.block_start(np.arange(self.blocks, dtype=np.int64)), self.n)

    @cached_property
    def fingerprint(self) -> str:
        """A digest of the block boundaries: the order follows the shards, so a re-sharded dataset differs.
        Hashed a chunk of blocks at a time (the same digest as of `bounds` whole)."""
        h = hashlib.sha256()
        for a in range(0, self.blocks, _CHUNK):
            h.update(self.block_start(np.arange(a, min(a + _CHUNK, self.blocks), dtype=np.int64)).tobytes())
        h.update(np.array([self.n], np.int64).tobytes())
        return h.hexdigest()[:16]

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
        self._perm = IndexShuffle.of(nb, seed=seed, epoch=epoch, stream=(_BLOCKS,))  # slot k holds block perm(k)
        slots = np.asarray(self._perm.inverse(layout.tails), np.int64)  # the tails' slots
        at = np.argsort(slots)
        self._tail_slots = slots[at]
        short = layout.block_frames - layout.tail_sizes[at]
        self._short = np.concatenate([[0], np.cumsum(short)]).astype(np.int64)  # shortfall before the i-th tail
        # tail i ends at (slot + 1) * block_frames - shortfall up to and with it
        self._tail_ends = (self._tail_slots + 1) * layout.block_frames - self._short[1:]
        self.windows = -(-nb // m)

    def __len__(self) -> int:
        return self.layout.n

    def start_of(self, slots: np.ndarray | int) -> np.ndarray:
        """The first stream position of each slot (``start_of(blocks)`` is ``n``)."""
        k = np.asarray(slots, np.int64)
        return k * self.layout.block_frames - self._short[np.searchsorted(self._tail_slots, k, side="left")]

    def slots(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(slot, offset in it) of each stream position (before the window shuffle)."""
        p = np.asarray(positions, np.int64)
        i = np.searchsorted(self._tail_ends, p, side="right")  # the tails wholly before p
        q = p + self._short[i]
        return q // self.layout.block_frames, q % self.layout.block_frames

    def _check(self, positions: np.ndarray | int) -> np.ndarray:
        p = np.asarray(positions, np.int64)
        if p.size and (p.min() < 0 or p.max() >= self.layout.n):
            raise IndexError(f"positions should be in [0, {self.layout.n})")
        return p

    def window_of(self, positions: np.ndarray | int) -> np.ndarray:
        """The window of each stream position (int64, the shape of ``positions``)."""
        return self.slots(self._check(positions))[0] // self.layout.window_blocks

    def __call__(self, positions: np.ndarray | int) -> np.ndarray:
        """The frame at each stream position (int64, the shape of ``positions``)."""
        p = self._check(positions)
        w = self.window_of(p)
        r = np.empty_like(p)
        for win in np.unique(w).tolist():  # a batch spans one or two windows
            at = w == win
            start, end = self.start(win), self.start(win + 1)
            shuffle = IndexShuffle.of(end - start, seed=self.seed, epoch=self.epoch, stream=(_WINDOW, win))
            r[at] = start + shuffle(p[at] - start)
        return self.at(*self.slots(r))

    def at(self, slots: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        """The frame ``offsets`` into the block of each slot of ``slots`` (before any window shuffle)."""
        k = np.asarray(slots, np.int64)
        return self.layout.block_start(self._perm(k.ravel()).reshape(k.shape)) + offsets

    def positions(self, window: int, *, rank: int, world_size: int, used: int) -> np.ndarray:
        """``rank``'s stream positions in ``window`` (ranks take every ``world_size``-th; those past ``used`` sit
        out)."""
        lo, hi = self.start(window), min(self.start(window + 1), used)
        first = lo + (rank - lo) % world_size
        return np.arange(first, max(first, hi), world_size, dtype=np.int64)

    def window_blocks(self, window: int) -> list[tuple[int, int]]:
        """``[(first frame, end frame)]`` of each block of ``window``, in slot order."""
        if not 0 <= window < self.windows:
            raise IndexError(f"window {window} should be in [0, {self.windows})")
        m = self.layout.window_blocks
        blocks = self._perm(np.arange(window * m, min((window + 1) * m, self.layout.blocks), dtype=np.int64))
        return list(zip(self.layout.block_start(blocks).tolist(), self.layout.block_end(blocks).tolist()))

    def start(self, window: int) -> int:
        """The first stream position of ``window`` (``start(windows)`` is ``n``)."""
        return int(self.start_of(min(window * self.layout.window_blocks, self.layout.blocks)))
