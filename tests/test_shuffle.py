import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from episodepipes.pipes.order.shuffle import FrameTable, batches_per_epoch, epoch_permutation, rank_order, rank_slice
from episodepipes.pipes.plan import Item


@given(n=st.integers(0, 300), world=st.integers(1, 8), seed=st.integers(0, 2**32), epoch=st.integers(0, 50))
def test_ranks_cover_every_frame_once_before_trimming(n, world, seed, epoch):
    perm = epoch_permutation(n, seed=seed, epoch=epoch)
    parts = [rank_slice(perm, rank=r, world_size=world) for r in range(world)]
    assert sorted(np.concatenate(parts).tolist()) == list(range(n))


@given(n=st.integers(0, 300), world=st.integers(1, 8), batch=st.integers(1, 16), seed=st.integers(0, 99))
def test_ranks_get_equal_whole_batches_of_distinct_frames(n, world, batch, seed):
    per = batches_per_epoch(n, world_size=world, batch_size=batch)
    orders = [rank_order(n, seed=seed, epoch=0, rank=r, world_size=world, batch_size=batch) for r in range(world)]
    assert all(len(o) == per * batch for o in orders)
    flat = np.concatenate(orders).tolist()
    assert len(set(flat)) == len(flat)
    assert n - len(flat) < world * batch  # drop-last trims less than one global batch


def test_order_depends_on_seed_and_epoch_only():
    a = epoch_permutation(1000, seed=3, epoch=1)
    assert np.array_equal(a, epoch_permutation(1000, seed=3, epoch=1))
    assert not np.array_equal(a, epoch_permutation(1000, seed=3, epoch=2))
    assert not np.array_equal(a, epoch_permutation(1000, seed=4, epoch=1))


def test_bad_options_name_the_value():
    with pytest.raises(ValueError, match="batch_size=0"):
        batches_per_epoch(10, world_size=1, batch_size=0)
    with pytest.raises(ValueError, match="rank=2"):
        rank_slice(np.arange(4), rank=2, world_size=2)


def test_frame_table_round_trip():
    t = FrameTable(["a", "b", "c"], [3, 1, 2])
    assert len(t) == 6
    assert [t.item(i) for i in range(6)] == [Item("a", 0), Item("a", 1), Item("a", 2), Item("b", 0), Item("c", 0),
                                             Item("c", 1)]
    with pytest.raises(IndexError, match="6"):
        t.locate(6)


def test_fingerprint_changes_with_the_episodes_their_order_and_lengths():
    fp = FrameTable(["a", "b"], [3, 4]).fingerprint()
    assert fp == FrameTable(["a", "b"], [3, 4]).fingerprint() and len(fp) == 16
    others = [FrameTable(["b", "a"], [4, 3]), FrameTable(["a", "b"], [4, 3]), FrameTable(["a", "c"], [3, 4]),
              FrameTable(["a", "b", "c"], [3, 4, 0]), FrameTable(["ab"], [7])]
    assert len({fp, *(t.fingerprint() for t in others)}) == len(others) + 1
