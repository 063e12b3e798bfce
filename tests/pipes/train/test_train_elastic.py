"""Elastic resume of train_pipe: a state saved at one world size continues the global stream exactly at another.

The global stream of a run is its samples in global order: at step ``s``, sample ``i`` of rank ``r``'s batch
is entry ``s*W*B + i*W + r``. Resuming under another world size (same ``W*B``) must give the rest of the
stream an uninterrupted run at the new size gives, with nothing repeated or skipped.
"""

import itertools
import logging

import numpy as np
import pytest
from helpers import make_shards

from episodepipes.pipes import EpisodeIndex
from episodepipes.pipes.order.window import plan_windows
from episodepipes.pipes.train import STEPS_AHEAD, TrainReader, train_pipe

SHAPE = dict(num_episodes=6, lengths=(12, 7, 5, 9, 11, 4), height=16, width=24)  # train: 39 frames
KW = dict(seed=4, num_workers=1, history={"state": 2}, epochs=2)


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    return EpisodeIndex.open(make_shards(tmp_path_factory.mktemp("elastic") / "s", shard_size=20_000, **SHAPE))


def _batches(pipe, steps=None):
    return [list(zip(b["episode"], b["frame"].tolist())) for b in itertools.islice(iter(pipe), steps)]


def _pipes(index, world, batch, state=None, **kw):
    out = []
    for rank in range(world):
        pipe = train_pipe(index, **{**KW, **kw}, batch_size=batch, rank=rank, world_size=world)
        if state is not None:
            pipe.load_state_dict(state)
        out.append(pipe)
    return out


def _run(pipes, steps=None):
    """The global stream of ``steps`` steps over every rank's pipe (all of them when None), in global order,
    and each rank's state after them."""
    per_rank = [_batches(p, steps) for p in pipes]
    world, batch = len(pipes), len(per_rank[0][0])
    assert len({len(b) for b in per_rank}) == 1  # every rank has the same number of batches
    stream = [None] * (len(per_rank[0]) * world * batch)
    for r, batches in enumerate(per_rank):
        for s, b in enumerate(batches):
            assert len(b) == batch
            for i, item in enumerate(b):
                stream[s * world * batch + i * world + r] = item
    return stream, [p.state_dict() for p in pipes]


SIZES = [(1, 6), (2, 3), (3, 2)]  # W = 1, 2, 3 at the same global batch of 6


def test_the_global_stream_depends_on_the_global_batch_only(index):
    streams = [_run(_pipes(index, w, b))[0] for w, b in SIZES]
    assert streams[0] == streams[1] == streams[2]
    assert len(streams[0]) == 2 * 36  # two epochs of 39 // 6 steps of 6
    epoch0, epoch1 = streams[0][:36], streams[0][36:]
    assert len(set(epoch0)) == len(set(epoch1)) == 36 and epoch0 != epoch1


@pytest.mark.parametrize("old, new", [(a, b) for a in SIZES for b in SIZES if a != b])
@pytest.mark.parametrize("stop", [2, 6, 8])  # mid-epoch 0, its end, mid-epoch 1 (6 steps per epoch)
def test_a_state_resumes_the_global_stream_exactly_at_another_world_size(index, old, new, stop):
    want = _run(_pipes(index, *new))[0]
    head, states = _run(_pipes(index, *old), stop)
    for state in (states[0], states[-1]):  # rank 0's, as Lightning saves, or any other rank's
        rest, _ = _run(_pipes(index, *new, state=state))
        assert head + rest == want
        for s in range(len(rest) // 6):  # so every step's union over ranks is the uninterrupted step's
            assert sorted(rest[6 * s:6 * s + 6]) == sorted(want[len(head) + 6 * s:len(head) + 6 * s + 6])


def test_a_chain_of_resizes_continues_one_stream(index):
    """W=2,B=3 -> W=3,B=2 -> W=1,B=6, each resumed from the last size's state (of a rank other than 0)."""
    want = _run(_pipes(index, 1, 6))[0]
    a, states = _run(_pipes(index, 2, 3), 3)
    b, states = _run(_pipes(index, 3, 2, state=states[1]), 4)  # into epoch 1
    c, _ = _run(_pipes(index, 1, 6, state=states[2]))
    assert a + b + c == want and len(c) == 5 * 6


def test_the_same_size_resumes_inside_a_batch_another_size_is_refused_there(index):
    def reader(world, batch, rank=0):
        r = TrainReader(index, index.split("train"), windows=plan_windows(None, None, cameras=set(), arrays=set()),
                        seed=4, rank=rank, world_size=world, batch_size=batch, epochs=1)
        r.reset(None)
        return r

    def items(r, k=None):
        return [(s.item.episode, s.item.frame) for s in itertools.islice(r, k)]

    first = reader(2, 3)
    items(first, 4)
    state = first.state_dict()
    assert state["pos"] == 4 and state["consumed"] == 8
    same = reader(2, 3)
    same.reset(state)
    assert items(same) == items(reader(2, 3))[4:]
    with pytest.raises(ValueError, match=r"inside a batch \(pos=4, batch_size=3\).*world_size=2 -> 3, batch_size=3 "
                                         r"-> 2.*checkpoint's world_size and batch_size"):
        reader(3, 2).reset(state)


def test_another_global_batch_is_refused_unless_on_resize_allows_a_skip(index, caplog):
    head, (state, _) = _run(_pipes(index, 2, 3), 2)  # 12 samples of epoch 0 consumed
    with pytest.raises(ValueError, match=r"global_batch=6 \(world_size=2 x batch_size=3\) in the state, 4 "
                                         r"\(world_size=2 x batch_size=2\) here.*on_resize='next_step'"):
        _pipes(index, 2, 2, state=state)
    # 4 divides 12: the new size has a step starting there, and continues exactly, silently
    with caplog.at_level(logging.WARNING):
        rest, _ = _run(_pipes(index, 2, 2, state=state, on_resize="next_step"))
    assert head + rest == _run(_pipes(index, 2, 2))[0] and not caplog.records
    # 9 does not divide 12: the next step of 9 starts at 18, skipping 6 samples, with a warning
    want = _run(_pipes(index, 3, 3))[0]
    with caplog.at_level(logging.WARNING):
        rest, _ = _run(_pipes(index, 3, 3, state=state, on_resize="next_step"))
    assert rest == want[18:] and "6 samples skipped" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        rest, _ = _run(_pipes(index, 3, 3, state=state, on_resize="next_epoch"))
    assert rest == want[36:] and "the rest of epoch 0 (27 samples) skipped" in caplog.text
    with pytest.raises(ValueError, match=r"on_resize='skip' should be one of \('refuse', 'next_step', 'next_epoch'\)"):
        train_pipe(index, batch_size=3, seed=4, rank=0, world_size=1, on_resize="skip")


@pytest.mark.parametrize("bad, why", [
    (dict(consumed=5), "consumed pos\\*world_size"),
    (dict(global_batch=7), "global_batch should be world_size\\*batch_size"),
    (dict(world_size=0, global_batch=0, consumed=0), "world_size=0"),
    (dict(pos=30, consumed=60), "pos within the epoch's 39 frames"),
    (dict(consumed=-6), "not non-negative ints"),
])
def test_a_state_whose_sizes_do_not_add_up_is_refused(index, bad, why):
    _, (state, _) = _run(_pipes(index, 2, 3), 2)
    state["root"]["source"]["source"].update(bad)
    with pytest.raises(ValueError, match=why):
        _pipes(index, 3, 2, state=state)


def test_the_reader_holds_a_few_batches_of_the_order_not_the_epochs(index):
    """The order is computed per run of steps from the keyed shuffle: nothing proportional to the frames is kept
    (the cached steps' frames, and two numbers per episode)."""
    r = TrainReader(index, index.split("train"), windows=plan_windows(None, None, cameras=set(), arrays=set()),
                    seed=4, rank=0, world_size=1, batch_size=2, epochs=1)
    r.reset(None)
    assert len(list(r)) == 38
    held = [v for v in vars(r).values() if isinstance(v, np.ndarray)]
    held += [a for v in vars(r).values() if isinstance(v, tuple) for a in v if isinstance(a, np.ndarray)]
    episodes = len(index.split("train"))
    assert held and sum(a.size for a in held) <= STEPS_AHEAD * 2 + 2 * episodes + 1 < len(r.table)
