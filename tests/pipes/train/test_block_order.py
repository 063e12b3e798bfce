"""The block order: a bijection of [0, n) whose windows are shuffled runs of whole blocks of one shard."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from episodepipes.pipes.order.block_order import BlockLayout, block_bounds


def _layout(shards, b, m):
    return BlockLayout(block_bounds(np.asarray(shards), b), block_frames=b, window_blocks=m)


def test_blocks_end_at_a_shard_change_and_after_block_frames_frames():
    bounds = block_bounds(np.array([0] * 7 + [1] * 2 + [2] * 5), 3)
    assert bounds.tolist() == [0, 3, 6, 7, 9, 12, 14]


shard_runs = st.lists(st.integers(1, 40), min_size=1, max_size=12)


@given(runs=shard_runs, b=st.integers(1, 9), m=st.integers(1, 5), seed=st.integers(0, 2**32), epoch=st.integers(0, 5))
def test_the_order_is_a_bijection_whose_windows_are_whole_blocks_of_one_shard(runs, b, m, seed, epoch):
    shards = np.repeat(np.arange(len(runs)), runs)
    layout = _layout(shards, b, m)
    order = layout.order(seed=seed, epoch=epoch)
    n = len(shards)
    got = order(np.arange(n))
    assert sorted(got.tolist()) == list(range(n))
    assert order(np.arange(n)).tolist() == layout.order(seed=seed, epoch=epoch)(np.arange(n)).tolist()
    for w in range(order.windows):  # a window's positions hold exactly its blocks' frames
        lo, hi = order.start(w), order.start(w + 1)
        blocks = order.window_blocks(w)
        assert 1 <= len(blocks) <= m
        assert sorted(got[lo:hi].tolist()) == sorted(f for a, z in blocks for f in range(a, z))
        for a, z in blocks:
            assert z - a <= b and len(set(shards[a:z].tolist())) == 1
        assert (order.window_of(np.arange(lo, hi)) == w).all()
    assert order.start(order.windows) == n


def test_the_order_depends_on_seed_and_epoch_and_mixes_within_windows():
    layout = _layout(np.repeat(np.arange(4), 50), 10, 4)
    orders = {(s, e): tuple(layout.order(seed=s, epoch=e)(np.arange(200)).tolist()) for s in (0, 1) for e in (0, 1)}
    assert len(set(orders.values())) == 4
    first = np.array(orders[0, 0][:40])  # window 0: 4 blocks of 10, its frames interleaved, not block by block
    assert len({int(f) // 10 for f in first[:10]}) > 1


def test_a_layout_that_is_not_bounds_is_refused():
    for bad in ([1, 3], [0, 3, 3], [0, 5, 2]):
        with pytest.raises(ValueError, match="block bounds"):
            BlockLayout(np.array(bad), block_frames=4, window_blocks=2)
    with pytest.raises(ValueError, match="window_blocks=0"):
        BlockLayout(np.array([0, 4]), block_frames=4, window_blocks=0)
