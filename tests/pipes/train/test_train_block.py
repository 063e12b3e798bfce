"""train_pipe(shuffle="block"): every frame once per epoch, deterministic, exactly and elastically resumable,
even over 2 DDP ranks, its state refused by a pipe of another order; a mixture refuses it."""

from __future__ import annotations

import itertools
import json
import os
from datetime import timedelta

import pytest
import torch.distributed as dist
from helpers import make_shards, spawn_two_ranks
from nodes_contract import Exact, run_test_save_load_state

from episodepipes.pipes import EpisodeIndex, Source
from episodepipes.pipes.train import train_pipe

SHAPE = dict(num_episodes=6, lengths=(12, 7, 5, 9, 11, 4), height=16, width=24)  # train: 39 frames
BLOCK = dict(shuffle="block", block_frames=4, window_blocks=2)
KW = dict(seed=4, num_workers=1, history={"state": 2}, epochs=2, **BLOCK)


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    return EpisodeIndex.open(make_shards(tmp_path_factory.mktemp("block") / "s", shard_size=60_000, **SHAPE))


def _items(pipe, steps=None):
    return [(e, f) for b in itertools.islice(iter(pipe), steps) for e, f in zip(b["episode"], b["frame"].tolist())]


def _stream(index, world, batch, state=None, steps=None, **kw):
    """The global stream of every rank's pipe in global order, and rank 0's state after ``steps`` steps."""
    pipes = [train_pipe(index, **{**KW, **kw}, batch_size=batch, rank=r, world_size=world) for r in range(world)]
    for p in pipes:
        if state is not None:
            p.load_state_dict(state)
    per_rank = [_items(p, steps) for p in pipes]
    assert len({len(x) for x in per_rank}) == 1  # every rank the same number of samples
    out = [None] * (len(per_rank[0]) * world)
    for r, items in enumerate(per_rank):
        for k, item in enumerate(items):
            step, i = divmod(k, batch)
            out[step * world * batch + i * world + r] = item
    return out, pipes[0].state_dict()


def test_every_frame_comes_once_per_epoch_in_a_seeded_order_of_shard_blocks(index):
    reader = train_pipe(index, **KW, batch_size=3, rank=0, world_size=1).reader
    assert reader.blocks.blocks > 2 * reader.blocks.window_blocks  # several windows
    one = _items(train_pipe(index, **KW, batch_size=3, rank=0, world_size=1))
    assert one == _items(train_pipe(index, **KW, batch_size=3, rank=0, world_size=1))  # deterministic
    epoch0, epoch1 = one[:39], one[39:]
    assert len(set(epoch0)) == len(set(epoch1)) == 39 and epoch0 != epoch1  # every frame, 39 // 3 * 3 = 39
    full = _items(train_pipe(index, **{**KW, "shuffle": "full", "block_frames": None, "window_blocks": None},
                             batch_size=3, rank=0, world_size=1))
    assert set(full[:39]) == set(epoch0) and full[:39] != epoch0
    assert _items(train_pipe(index, **{**KW, "seed": 5}, batch_size=3, rank=0, world_size=1))[:39] != epoch0
    flat = {item: k for k, item in enumerate((e.id, f) for e in index.split("train") for f in range(e.length))}
    bounds, m = reader.blocks.bounds.tolist(), reader.blocks.window_blocks
    order = reader.blocks.order(seed=KW["seed"], epoch=0)
    for w in range(order.windows):  # each window of the stream is m whole blocks' frames
        lo, hi = order.start(w), order.start(w + 1)
        blocks = {next(b for b in range(len(bounds) - 1) if bounds[b] <= flat[x] < bounds[b + 1]) for x in
                  epoch0[lo:hi]}
        assert len(blocks) <= m and sum(bounds[b + 1] - bounds[b] for b in blocks) == hi - lo


def test_drop_last_keeps_whole_batches_on_every_rank(index):
    stream, _ = _stream(index, 2, 4)  # 39 // 8 = 4 steps of 8 per epoch
    assert len(stream) == 2 * 32 and len(set(stream[:32])) == 32


@pytest.mark.parametrize("midpoint", [0, 3])
def test_the_root_node_follows_torchdatas_save_load_contract(index, midpoint):
    root = train_pipe(index, **{**KW, "epochs": 1}, batch_size=3, rank=0, world_size=1, horizon={"action": 2})._root
    run_test_save_load_state(Exact(), root, midpoint)


@pytest.mark.parametrize("stop", [2, 4, 6])  # mid-epoch 0, its end, mid-epoch 1 (4 steps of 8 per epoch)
def test_a_state_of_2_ranks_resumes_the_global_stream_exactly_on_1(index, stop):
    want, _ = _stream(index, 1, 8)
    assert want == _stream(index, 2, 4)[0]  # the stream depends on the global batch only
    head, state = _stream(index, 2, 4, steps=stop)
    rest, _ = _stream(index, 1, 8, state=state)
    assert head + rest == want


def test_a_state_of_another_order_is_refused_by_name(index):
    def state(**kw):
        pipe = train_pipe(index, **{**KW, **kw}, batch_size=3, rank=0, world_size=1)
        _items(pipe, 2)
        return pipe.state_dict()

    full = dict(shuffle="full", block_frames=None, window_blocks=None)
    for saved, loading in ((full, {}), ({}, full), ({"block_frames": 5}, {}), ({"window_blocks": 3}, {})):
        pipe = train_pipe(index, **{**KW, **loading}, batch_size=3, rank=0, world_size=1)
        with pytest.raises(ValueError, match=r"shuffle=.* in the state.*shuffle=, block_frames= and window_blocks="):
            pipe.load_state_dict(state(**saved))
    again = train_pipe(index, **KW, batch_size=3, rank=0, world_size=1)
    again.load_state_dict(state())  # the same order resumes


def test_the_same_episodes_resharded_are_refused_in_the_block_order(index, tmp_path):
    other = EpisodeIndex.open(make_shards(tmp_path / "s", shard_size=25_000, **SHAPE))
    pipe = train_pipe(index, **KW, batch_size=3, rank=0, world_size=1)
    _items(pipe, 1)
    with pytest.raises(ValueError, match="block order follows the shard layout"):
        train_pipe(other, **KW, batch_size=3, rank=0, world_size=1).load_state_dict(pipe.state_dict())


@pytest.mark.parametrize("kw, match", [
    (dict(shuffle="blocks"), r"shuffle='blocks' should be one of \('full', 'block', 'rank_block'\)"),
    (dict(block_frames=8), "block_frames=8 and window_blocks=None set the block order; pass shuffle='block'"),
    (dict(shuffle="block", block_frames=0), "block_frames=0 should be an int >= 1"),
    (dict(shuffle="block", window_blocks=2.5), "window_blocks=2.5 should be an int >= 1"),
])
def test_bad_block_options_are_refused_by_name(index, kw, match):
    with pytest.raises(ValueError, match=match):
        train_pipe(index, batch_size=3, seed=0, rank=0, world_size=1, **kw)


def test_a_mixture_refuses_the_block_order_saying_what_to_do(index):
    with pytest.raises(ValueError, match=r"shuffle='block' is not supported for a mixture.*pass shuffle='full'"):
        train_pipe({"a": Source(index, 1), "b": Source(index, 1)}, batch_size=3, seed=0, rank=0, world_size=1,
                   **BLOCK)


def _rank_main(rank: int, root: str, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=timedelta(seconds=60))
    try:
        pipe = train_pipe(root, batch_size=4, seed=1, num_workers=1, **BLOCK)
        batches = [list(zip(b["episode"], b["frame"].tolist())) for b in pipe]
        with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
            json.dump({"batches": batches, "len": len(pipe)}, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_two_ddp_ranks_get_even_disjoint_batches_of_the_global_stream(index, tmp_path):
    ranks = spawn_two_ranks(_rank_main, tmp_path, str(index.root))
    assert [len(r["batches"]) for r in ranks] == [r["len"] for r in ranks] == [4, 4]  # 39 // 8
    a, b = ({tuple(i) for batch in r["batches"] for i in batch} for r in ranks)
    assert len(a) == len(b) == 16 and not a & b
    want, _ = _stream(index, 2, 4, seed=1, epochs=1, history=None)
    assert want == [tuple(ranks[k % 2]["batches"][k // 8][(k % 8) // 2]) for k in range(32)]
