"""The rank-sharded block order (shuffle="rank_block"): each rank reads whole blocks of its own share, so on an
object store a rank fetches about the bytes it uses at any world size, and ranks stay even."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from nodes_contract import Exact, run_test_save_load_state

from episodepipes.pipes import EpisodeIndex
from episodepipes.pipes.order.block_order import BlockLayout, run_bounds
from episodepipes.pipes.order.permute import rank_positions, steps_per_epoch
from episodepipes.pipes.order.rank_blocks import RankBlockLayout
from episodepipes.pipes.train import train_pipe

BUCKET = "rankblocks"
URL = f"s3://{BUCKET}/r"
SHAPE = dict(num_episodes=6, length=200, height=16, width=24)  # 1200 frames, of which train holds 800
RANK = dict(shuffle="rank_block", block_frames=4, window_blocks=2)


@settings(max_examples=80, deadline=None)
@example(runs=[3], b=3, m=1, world=3, batch=1, seed=0, epoch=0)  # one block split among three ranks
@given(runs=st.lists(st.integers(1, 60), min_size=1, max_size=8), b=st.integers(1, 8), m=st.integers(1, 4),
       world=st.integers(1, 6), batch=st.integers(1, 4), seed=st.integers(0, 2**32), epoch=st.integers(0, 3))
def test_each_ranks_frames_come_from_its_own_share_of_whole_blocks(runs, b, m, world, batch, seed, epoch):
    shards = np.repeat(np.arange(len(runs)), runs)
    n, steps = len(shards), steps_per_epoch(len(shards), world_size=world, batch_size=batch)
    layout = RankBlockLayout.ranked(BlockLayout.of_runs(run_bounds(shards), block_frames=b, window_blocks=m),
                                    world_size=world, batch_size=batch)
    order = layout.order(seed=seed, epoch=epoch)
    seen: list[int] = []
    shares = []
    for r in range(world):
        lo, hi = order.share(r)
        assert hi - lo in (n // world, n // world + 1)
        share = set(order.base.at(*order.base.slots(np.arange(lo, hi))).tolist())
        shares.append(share)
        if not steps:
            continue
        p = rank_positions(0, rank=r, world_size=world, batch_size=batch, steps=steps)
        got = order(p)
        assert set(got.tolist()) <= share  # this rank's frames lie in its share
        seen += got.tolist()
        windows = order.window_of(p)  # a window's positions are what positions() gives for it
        for w in np.unique(windows).tolist():
            assert sorted(order.positions(w, rank=r, world_size=world, used=steps * world * batch).tolist()) == \
                sorted(p[windows == w].tolist())
    assert len(seen) == len(set(seen)) == steps * world * batch  # disjoint, and every used position once
    assert sum(map(len, shares)) == n and set().union(*shares) == set(range(n))  # the shares cover the frames
    blocks = [set(layout.block_of(np.array(sorted(s), np.int64)).tolist()) for s in shares]
    held = Counter(k for s in blocks for k in s)  # blocks more than one rank reads
    assert sum(c > 1 for c in held.values()) <= world - 1  # only a block one of the W-1 cuts falls in is split


@pytest.fixture(scope="module")
def shards(moto, shard_folder) -> Path:
    out = shard_folder("rank-blocks", **SHAPE)
    moto.upload_dir(out, BUCKET, "r")
    return out


def test_at_eight_ranks_each_fetches_at_most_1_1x_the_bytes_it_uses_in_a_request_per_block(shards, proxy):
    index = EpisodeIndex.open(URL)
    index.frame_ranges(np.arange(index.frames))  # the index's own column blocks fetched now: count shard bytes only
    kw = dict(batch_size=4, seed=1, world_size=8, num_workers=1, **RANK)
    seen: list[tuple[str, int]] = []
    for rank in range(8):
        pipe = train_pipe(index, rank=rank, **kw)
        proxy.reset()
        items = [(e, int(f)) for b in pipe for e, f in zip(b["episode"], b["frame"])]
        assert len(items) == len(pipe) * 4 == 800 // 32 * 4  # even over ranks: every rank the same batches
        used = sum(b - a for a, b in (index.episode(e).frame_range(f)[1:] for e, f in items))
        touched = {int(x) for x in pipe.reader.blocks.block_of(np.array(  # this rank's blocks
            [pipe.reader.table.starts[index.split("train").index(index.episode(e))] + f for e, f in items]))}
        assert used <= proxy.body_bytes <= 1.1 * used, (rank, proxy.body_bytes / used)
        assert len(proxy.gets()) <= len(touched)  # a ranged GET per block (adjacent ones merge)
        seen += items
    assert len(set(seen)) == len(seen)  # no frame on two ranks


def test_a_rank_block_pipe_follows_torchdatas_save_load_contract(shards):
    kw = dict(batch_size=4, seed=2, num_workers=1, epochs=1, **RANK)
    for midpoint in (0, 7):
        root = train_pipe(shards, rank=1, world_size=4, **kw)._root
        run_test_save_load_state(Exact(), root, midpoint)
    pipe = train_pipe(shards, rank=1, world_size=4, **kw)
    it = iter(pipe)
    for _ in range(3):
        next(it)
    state = pipe.state_dict()
    again = train_pipe(shards, rank=1, world_size=4, **kw)
    again.load_state_dict(state)
    assert [b["frame"].tolist() for b in again] == [b["frame"].tolist() for b in it]


def _items(batch) -> list[tuple[str, int]]:
    return [(e, int(f)) for e, f in zip(batch["episode"], batch["frame"])]


def test_a_state_resumes_elastically_at_another_world_size_finishing_its_epoch_on_the_saved_shares(shards):
    kw = dict(seed=3, num_workers=1, epochs=2, **RANK)
    two = [[_items(b) for b in train_pipe(shards, rank=r, world_size=2, batch_size=4, **kw)] for r in (0, 1)]
    per_epoch = len(two[0]) // 2
    pipe = train_pipe(shards, rank=0, world_size=2, batch_size=4, **kw)
    it = iter(pipe)
    for _ in range(3):
        next(it)
    state = pipe.state_dict()
    one = train_pipe(shards, rank=0, world_size=1, batch_size=8, **kw)  # the same global batch on one rank
    one.load_state_dict(state)
    it1 = iter(one)
    rest = [_items(next(it1)) for _ in range(3, per_epoch)]
    for step, got in zip(range(3, per_epoch), rest, strict=True):  # each global batch is the saved stream's
        assert sorted(got) == sorted(two[0][step] + two[1][step])
    fresh = [_items(b) for b in train_pipe(shards, rank=0, world_size=1, batch_size=8, **kw)]
    assert [_items(b) for b in it1] == fresh[per_epoch:]  # the next epoch deals this world's own shares


def test_a_state_saved_inside_a_carried_epoch_resumes_exactly_at_either_size(shards):
    kw = dict(seed=4, num_workers=1, epochs=1, **RANK)
    two = [[_items(b) for b in train_pipe(shards, rank=r, world_size=2, batch_size=4, **kw)] for r in (0, 1)]
    pipe = train_pipe(shards, rank=1, world_size=2, batch_size=4, **kw)
    it = iter(pipe)
    for _ in range(2):
        next(it)
    one = train_pipe(shards, rank=0, world_size=1, batch_size=8, **kw)
    one.load_state_dict(pipe.state_dict())
    it1 = iter(one)
    for _ in range(3):
        next(it1)
    carried = one.state_dict()
    again = train_pipe(shards, rank=0, world_size=1, batch_size=8, **kw)  # the same size again: the same stream
    again.load_state_dict(carried)
    assert [_items(b) for b in again] == [_items(b) for b in it1]
    for r in (0, 1):  # back to the saving world: its own batches, the saved order's
        back = train_pipe(shards, rank=r, world_size=2, batch_size=4, **kw)
        back.load_state_dict(carried)
        assert [_items(b) for b in back] == two[r][5:]


@pytest.mark.parametrize("batch", [4, 3])
def test_another_global_batch_resumes_a_rank_block_state_as_the_block_order_does(shards, batch):
    """The saved epoch is read on the saved order at the new global batch: its positions are every frame once
    (the shares' undealt tails last), so a batch that divides what was consumed continues exactly, and one that
    does not skips to its next step (fewer than a global batch of frames); never a frame twice."""
    kw = dict(seed=5, num_workers=1, epochs=2, **RANK)
    two = [train_pipe(shards, rank=r, world_size=2, batch_size=4, **kw) for r in (0, 1)]
    its = [iter(p) for p in two]
    before = [x for it in its for x in _items(next(it))]  # the first global step: 8 frames
    state = two[0].state_dict()
    with pytest.raises(ValueError, match="global_batch=8"):  # another global batch is refused unless allowed
        train_pipe(shards, rank=0, world_size=1, batch_size=batch, **kw).load_state_dict(state)
    one = train_pipe(shards, rank=0, world_size=1, batch_size=batch, on_resize="next_step", **kw)
    one.load_state_dict(state)
    it1 = iter(one)
    per_epoch = 800 // batch
    start = -(-8 // batch)  # the new size's next step at or after the 8 frames consumed
    rest = [x for _ in range(start, per_epoch) for x in _items(next(it1))]
    assert len(set(before + rest)) == len(before + rest) == 8 + (per_epoch - start) * batch  # no frame twice
    assert len(before + rest) == (800 if batch == 4 else 800 - 1 - 2)  # all 800; at 3: 1 skipped, 2 dropped last
    fresh = [_items(b) for b in train_pipe(shards, rank=0, world_size=1, batch_size=batch, **kw)]
    assert [_items(b) for b in it1] == fresh[per_epoch:]  # the next epoch deals this world's own shares
    skip = train_pipe(shards, rank=0, world_size=1, batch_size=batch, on_resize="next_epoch", **kw)
    skip.load_state_dict(state)
    got = [_items(b) for b in skip]
    if batch == 4:  # it divides the 8 consumed: the same exact resume
        assert [x for b in got[:per_epoch - start] for x in b] == rest and got[per_epoch - start:] == fresh[per_epoch:]
    else:  # the rest of the epoch skipped
        assert got == fresh[per_epoch:]


def test_the_positions_past_the_dealt_steps_are_the_shares_tails_every_frame_once():
    """Positions ``0 .. n`` of a rank-sharded order are a permutation of the frames whatever the sizes, so any
    global batch reads an epoch of it without repeats."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        shards = np.repeat(np.arange(5), rng.integers(1, 40, 5))
        world, batch = int(rng.integers(1, 7)), int(rng.integers(1, 5))
        layout = RankBlockLayout.ranked(BlockLayout.of_runs(run_bounds(shards), block_frames=int(rng.integers(1, 6)),
                                                            window_blocks=int(rng.integers(1, 4))),
                                        world_size=world, batch_size=batch)
        order = layout.order(seed=int(rng.integers(0, 100)), epoch=1)
        n = len(shards)
        assert sorted(order(np.arange(n)).tolist()) == list(range(n))
        ranks, local = order.local(np.arange(n))
        for r in range(world):  # each rank's positions are its whole share
            lo, hi = order.share(r)
            assert sorted(local[ranks == r].tolist()) == list(range(hi - lo))


def test_an_object_store_root_resumes_elastically_as_its_local_folder_does(shards, proxy):
    kw = dict(seed=6, num_workers=1, epochs=1, **RANK)
    runs = []
    for root in (shards, URL):
        pipe = train_pipe(root, rank=1, world_size=2, batch_size=4, **kw)
        it = iter(pipe)
        for _ in range(len(pipe) - 4):  # saved near the epoch's end: its last 4 global batches are carried
            next(it)
        one = train_pipe(root, rank=0, world_size=1, batch_size=8, **kw)
        one.load_state_dict(pipe.state_dict())
        runs.append([_items(b) for b in one])  # the carried epoch read without the window read-ahead, then its own
    assert runs[0] == runs[1] and len(runs[0]) == 4


@pytest.mark.parametrize("sizes", [(10**9, 1), (3, 300)])
def test_a_state_whose_rank_block_sizes_deal_no_step_is_refused_by_name(shards, sizes):
    kw = dict(seed=7, num_workers=1, epochs=1, **RANK)
    pipe = train_pipe(shards, rank=0, world_size=2, batch_size=4, **kw)
    it = iter(pipe)
    next(it)
    state = pipe.state_dict()
    reader = state
    while "seed" not in reader:  # the reader's state, some levels of "source" below the loader's root
        reader = next(v for v in reader.values() if isinstance(v, dict))
    reader["shuffle"] = {**reader["shuffle"], "world_size": sizes[0], "batch_size": sizes[1]}
    with pytest.raises(ValueError, match=f"world_size={sizes[0]} x batch_size={sizes[1]}, more than the epoch's "
                                         "800 frames"):
        train_pipe(shards, rank=0, world_size=1, batch_size=8, **kw).load_state_dict(state)
