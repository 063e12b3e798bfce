"""The rank-sharded block order: each rank reads whole blocks of its own, so ranks on separate machines fetch each
block once between them.

In the block order (`block_order`) every rank draws from every window, so with ``W`` ranks each one fetches the
whole of every block it touches: about ``W`` times the bytes it uses. Here an epoch's permuted blocks (the block
order's slots, in slot order) are cut into ``W`` contiguous shares of ``n // W`` or ``n // W + 1`` frames, one per
rank (a block a cut falls in is split between two ranks: at most ``W - 1`` blocks an epoch, each read by two). A
rank's share is cut into windows at every ``window_blocks``-th slot, and each window's frames are shuffled among
themselves (keyed by ``(seed, epoch, rank, window)``). Every rank gets at least ``n // W`` frames, and an epoch
uses ``n // (W*B)`` batches of each (drop-last), so ranks stay even (the DDP invariant).

It is a global stream like the others, so the cursor, drop-last and state carry over: position ``p = s*G + i*W + r``
(``G = W*B``) is rank ``r``'s local position ``q = s*B + i``, the ``q``-th frame of its shuffled share. The positions
past the ``D = (n // G) * G`` an epoch deals (what drop-last leaves of each share: its last ``hi - lo - D // W``
frames) are the shares' tails, rank after rank, so positions ``0 .. n`` are every frame once, as in the block order.
The stream depends on ``W`` and ``B``, not only on ``G``: a state resumes exactly at the same world size and batch
size; at other sizes the reader finishes the saved epoch on the saved order (`TrainReader.reset`,
`train_state.carried_sizes`), its positions read at the new global batch as the block order's are (exact where that
divides the consumed positions, else a step or the epoch skipped, `permute.resume_point`; never a frame twice).
Nothing per frame or block is stored: O(runs) per epoch, like the block order.
"""

from __future__ import annotations

import numpy as np

from episodepipes.pipes.order.block_order import BlockLayout, BlockOrder
from episodepipes.pipes.order.permute import IndexShuffle

_RANK_WINDOW = (1 << 31) + 3  # stream tag of a rank's window shuffle


class RankBlockLayout(BlockLayout):
    """A `BlockLayout` whose orders deal whole blocks to ``world_size`` ranks of ``batch_size`` (`RankBlockOrder`)."""

    world_size: int
    batch_size: int

    @classmethod
    def ranked(cls, layout: BlockLayout, *, world_size: int, batch_size: int) -> RankBlockLayout:
        out = cls.of_runs(layout.runs, block_frames=layout.block_frames, window_blocks=layout.window_blocks)
        assert isinstance(out, RankBlockLayout)
        out.world_size, out.batch_size = int(world_size), int(batch_size)
        return out

    def describe(self) -> dict[str, object]:
        return {**super().describe(), "shuffle": "rank_block", "world_size": self.world_size,
                "batch_size": self.batch_size}  # the shares follow both: another size is another order

    def order(self, *, seed: int, epoch: int) -> RankBlockOrder:  # type: ignore[override]
        return RankBlockOrder(self, seed=seed, epoch=epoch)


class RankBlockOrder(BlockOrder):
    """Epoch ``epoch``'s rank-sharded order: ``order(positions)`` -> frames of global stream positions; windows are
    numbered per rank (``window_of`` of rank ``r``'s positions gives ``r``'s windows). The block order's slots
    (`BlockOrder.slots`, `BlockOrder.at`) are its own, before the window shuffle."""

    def __init__(self, layout: RankBlockLayout, *, seed: int, epoch: int) -> None:
        super().__init__(layout, seed=seed, epoch=epoch)
        self.base = BlockOrder(layout, seed=seed, epoch=epoch)  # the slot sequence the shares are cut from
        self.world_size, self.batch_size = layout.world_size, layout.batch_size

    def share(self, rank: int) -> tuple[int, int]:
        """Rank ``rank``'s share ``[lo, hi)`` of the epoch's slot sequence."""
        n, w = self.layout.n, self.world_size
        return rank * n // w, (rank + 1) * n // w

    def local(self, positions: np.ndarray | int) -> tuple[np.ndarray, np.ndarray]:
        """(rank, local position) of each global stream position; those past the dealt steps are the shares'
        tails, rank after rank."""
        p = np.asarray(positions, np.int64)
        n, w, b = self.layout.n, self.world_size, self.batch_size
        if p.size and (p.min() < 0 or p.max() >= n):
            raise IndexError(f"positions should be in [0, {n})")
        g = w * b
        dealt = (n // g) * b  # each rank's dealt frames: its share's first ones
        rank, q = p % w, (p // g) * b + (p % g) // w
        tail = p >= dealt * w
        if tail.any():
            rank, q = rank.copy(), q.copy()
            rank[tail], q[tail] = self._tail(p[tail] - dealt * w, dealt)
        return rank, q

    def _tail(self, k: np.ndarray, dealt: int) -> tuple[np.ndarray, np.ndarray]:
        """(rank, local position) of the ``k``-th frame past the dealt ones: ranks' tails in rank order, rank
        ``r``'s starting at ``T(r) = r*n//W - r*dealt`` (non-decreasing: ``dealt <= n // W``), found by a binary
        search of ``r`` for every ``k`` at once."""
        n, w = self.layout.n, self.world_size

        def before(r: np.ndarray) -> np.ndarray:  # T(r), as r*(n//w) + r*(n%w)//w: no product past r*w
            return r * (n // w - dealt) + (r * (n % w)) // w

        lo, hi = np.zeros_like(k), np.full_like(k, w - 1)
        while (lo < hi).any():  # the last rank whose tail starts at or before k
            mid = (lo + hi + 1) // 2
            ok = before(mid) <= k
            lo, hi = np.where(ok, mid, lo), np.where(ok, hi, mid - 1)
        return lo, dealt + k - before(lo)

    def global_positions(self, rank: int, local: np.ndarray) -> np.ndarray:
        """The global stream positions of rank ``rank``'s local positions ``local``."""
        q = np.asarray(local, np.int64)
        return (q // self.batch_size) * (self.world_size * self.batch_size) + (q % self.batch_size) * self.world_size \
            + rank

    def _window_span(self, rank: int, window: int) -> tuple[int, int]:
        """``[a, b)`` of rank ``rank``'s window ``window`` in slot-sequence positions."""
        lo, hi = self.share(rank)
        m = self.layout.window_blocks
        first = int(self.base.slots(np.array([lo]))[0][0]) // m  # the block-order window lo falls in
        a = lo if window == 0 else int(self.base.start_of(min((first + window) * m, self.layout.blocks)))
        b = int(self.base.start_of(min((first + window + 1) * m, self.layout.blocks)))
        return max(lo, min(a, hi)), max(lo, min(b, hi))

    def _windows(self, rank: int, x: np.ndarray) -> np.ndarray:
        lo = self.share(rank)[0]
        m = self.layout.window_blocks
        first = int(self.base.slots(np.array([lo]))[0][0]) // m
        return self.base.slots(x)[0] // m - first

    def window_of(self, positions: np.ndarray | int) -> np.ndarray:
        """Each position's window, among its rank's windows (int64, the shape of ``positions``)."""
        r, q = self.local(positions)
        out = np.empty_like(q)
        for rank in np.unique(r).tolist():
            at = r == rank
            out[at] = self._windows(rank, self.share(rank)[0] + q[at])
        return out

    def __call__(self, positions: np.ndarray | int) -> np.ndarray:
        """The frame at each global stream position (int64, the shape of ``positions``)."""
        r, q = self.local(positions)
        x = np.empty_like(q)
        for rank in np.unique(r).tolist():
            at = r == rank
            lo, hi = self.share(rank)
            if (q[at] >= hi - lo).any():
                raise IndexError(f"a position of rank {rank} is past its share of {hi - lo} frames (drop-last)")
            xs = lo + q[at]
            ws = self._windows(rank, xs)
            got = np.empty_like(xs)
            for w in np.unique(ws).tolist():
                a, b = self._window_span(rank, w)
                sel = ws == w
                shuffle = IndexShuffle.of(b - a, seed=self.seed, epoch=self.epoch, stream=(_RANK_WINDOW, rank, w))
                got[sel] = a + shuffle(xs[sel] - a)
            x[at] = got
        return self.base.at(*self.base.slots(x))

    def positions(self, window: int, *, rank: int, world_size: int, used: int) -> np.ndarray:
        """``rank``'s global stream positions in its window ``window`` (those past ``used`` sit out)."""
        lo = self.share(rank)[0]
        a, b = self._window_span(rank, window)
        q = np.arange(a - lo, b - lo, dtype=np.int64)
        q = q[q < used // world_size]
        return self.global_positions(rank, q)
