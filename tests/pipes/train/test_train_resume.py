"""train_pipe resume: a saved state carries what its cursor depends on, and a state that does not fit is refused."""

import itertools

import pytest
import torch
from helpers import make_shards

from episodepipes.pipes import EpisodeIndex
from episodepipes.pipes.order.window import plan_windows
from episodepipes.pipes.train import TrainReader, train_pipe

SHAPE = dict(num_episodes=6, lengths=(12, 7, 5, 9, 11, 4), height=16, width=24)  # train: 39 frames


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    return EpisodeIndex.open(make_shards(tmp_path_factory.mktemp("resume") / "s", shard_size=20_000, **SHAPE))


def _items(batches):
    return [(e, f) for b in batches for e, f in zip(b["episode"], b["frame"].tolist())]


def _state_after(pipe, n):
    it = iter(pipe)
    for _ in range(n):
        next(it)
    return pipe.state_dict()


KW = dict(batch_size=3, seed=4, rank=0, world_size=2, num_workers=1, history={"state": 2})


@pytest.mark.parametrize("change, differs, fix", [
    (dict(world_size=1), r"global_batch=6 \(world_size=2 x batch_size=3\) in the state, 3 \(world_size=1 x "
     r"batch_size=3\) here", r"world_size\*batch_size equal to the checkpoint's global_batch.*on_resize="),
    (dict(world_size=3), r"global_batch=6 .* in the state, 9 \(world_size=3 x batch_size=3\) here", "on_resize="),
    (dict(batch_size=4), r"global_batch=6 .* in the state, 8 \(world_size=2 x batch_size=4\) here",
     "any world size and batch size with that product"),
    (dict(seed=5), r"seed=4 in the state, 5 here", "checkpoint's seed"),
    (dict(history={"state": 3}), r"windows=\{'state': \[-1, 0\]\} in the state, \{'state': \[-2, 0\]\} here",
     "checkpoint's history and horizon"),
    (dict(history=None, horizon={"action": 2}), r"windows=.*in the state", "history and horizon"),
])
def test_a_state_from_other_settings_is_refused_at_load_saying_what_differs(index, change, differs, fix):
    state = _state_after(train_pipe(index, **KW), 2)
    other = train_pipe(index, **{**KW, **change})
    with pytest.raises(ValueError, match=differs) as e:
        other.load_state_dict(state)  # at once, not at the next iter()
    assert e.match(fix)


def test_every_difference_is_named_in_one_message(index):
    state = _state_after(train_pipe(index, **KW), 1)
    with pytest.raises(ValueError, match=r"seed=4 in the state, 5 here; global_batch=6 .* in the state, 2 .* here; "
                                         r"windows=.*Build the pipe with the checkpoint's seed. Resume with world_s"):
        train_pipe(index, **{**KW, "world_size": 1, "batch_size": 2, "seed": 5, "history": {"state": 3}}
                   ).load_state_dict(state)


def test_a_state_from_other_episodes_is_refused_even_with_the_same_frame_count(index, tmp_path):
    state = _state_after(train_pipe(index, **KW), 2)
    swapped = EpisodeIndex.open(make_shards(tmp_path / "s", **{**SHAPE, "lengths": (7, 12, 5, 9, 11, 4)}))
    assert sum(e.length for e in swapped.split("train")) == 39  # same frames, other episode lengths
    with pytest.raises(ValueError, match=r"plan='[0-9a-f]{16}' in the state, '[0-9a-f]{16}' here.*same episodes"):
        train_pipe(swapped, **KW).load_state_dict(state)
    other_split = train_pipe(index, **{**KW, "split": "val", "batch_size": 1})
    with pytest.raises(ValueError, match=r"frames=39 in the state, 9 here"):
        other_split.load_state_dict(_state_after(train_pipe(index, **{**KW, "batch_size": 1}), 2))


def test_the_same_episodes_resharded_resume_exactly(index, tmp_path):
    """The check is on the episodes and lengths the order depends on, not on the shard files."""
    resharded = EpisodeIndex.open(make_shards(tmp_path / "s", shard_size=5_000, **SHAPE))
    assert len(resharded.shards) != len(index.shards)
    want = _items(train_pipe(index, **KW))
    pipe = train_pipe(index, **KW)
    head = _items(itertools.islice(iter(pipe), 2))
    fresh = train_pipe(resharded, **KW)
    fresh.load_state_dict(pipe.state_dict())
    assert head + _items(fresh) == want


def test_another_rank_continues_its_own_stream_from_the_same_position(index):
    """Lightning saves rank 0's loader state and every rank loads it: all ranks are at the same position."""
    rank1 = {**KW, "rank": 1}
    want = _items(train_pipe(index, **rank1))
    state = _state_after(train_pipe(index, **KW), 2)  # rank 0's
    pipe = train_pipe(index, **rank1)
    pipe.load_state_dict(state)
    assert _items(pipe) == want[2 * 3:]


def test_a_state_without_the_settings_is_refused(index):
    state = _state_after(train_pipe(index, **KW), 1)
    cursor = state["root"]["source"]["source"]
    for key in ("world_size", "rank", "batch_size", "frames", "plan", "windows", "consumed", "global_batch"):
        del cursor[key]  # the shape of states saved before they were recorded
    with pytest.raises(ValueError, match=r"has no \['consumed', 'world_size', 'rank', 'batch_size', 'global_batch', "
                                         r"'frames', 'plan', 'windows'\]"):
        train_pipe(index, **KW).load_state_dict(state)
    with pytest.raises(ValueError, match="not a train_pipe's state_dict"):
        train_pipe(index, **KW).load_state_dict({"root": {}})


@pytest.mark.parametrize("bad", [dict(pos=-1), dict(epoch=1.5), dict(stop="1"), dict(pos=True)])
def test_a_cursor_that_is_not_counts_is_refused(index, bad):
    state = _state_after(train_pipe(index, **KW), 1)
    state["root"]["source"]["source"].update(bad)
    with pytest.raises(ValueError, match="not non-negative ints"):
        train_pipe(index, **KW).load_state_dict(state)


def test_a_reader_restored_at_the_end_of_a_pass_is_exhausted(index):
    """torchdata's contract: a state saved at the end restores to an exhausted node; reset(None) starts the next."""
    def reader():
        return TrainReader(index, index.split("train"), windows=plan_windows(None, None, cameras=set(), arrays=set()),
                           seed=0, rank=0, world_size=1, batch_size=13, epochs=1)

    first = reader()
    epoch0 = [(r.item.episode, r.item.frame) for r in first]
    end = first.state_dict()
    fresh = reader()
    fresh.reset(end)
    with pytest.raises(StopIteration):
        next(fresh)
    fresh.reset(None)
    epoch1 = [(r.item.episode, r.item.frame) for r in itertools.islice(fresh, 39)]
    assert sorted(epoch1) == sorted(epoch0) and epoch1 != epoch0
    again = reader()
    again.reset(None)
    list(again)
    again.reset(None)
    assert [(r.item.episode, r.item.frame) for r in again] == epoch1


def test_a_pipe_restored_at_the_end_of_a_pass_gives_the_next_pass(index):
    kw = {**KW, "epochs": 1}
    ref = train_pipe(index, **kw)
    first, second = _items(ref), _items(ref)
    pipe = train_pipe(index, **kw)
    assert _items(pipe) == first
    fresh = train_pipe(index, **kw)
    fresh.load_state_dict(pipe.state_dict())
    assert _items(fresh) == second
    assert torch.is_tensor(next(iter(fresh))["state"])  # and it keeps going, pass after pass


@pytest.mark.parametrize("method", ["thread", "process"])
def test_the_root_node_follows_torchdatas_save_load_contract(index, method):
    """The steps of torchdata's own save/load check (test/nodes/utils.py), on the root node of a train_pipe."""
    from torchdata.nodes import Loader

    def keys(batches):
        return [(b["episode"], b["frame"].tolist(), b["state"].sum().item()) for b in batches]

    node = train_pipe(index, **{**KW, "world_size": 1, "method": method, "batch_size": 4})._root
    x = Loader(node)
    initial = x.state_dict()
    it = iter(x)
    epoch0 = [next(it) for _ in range(3)]
    middle = x.state_dict()
    epoch0 = keys(epoch0 + list(it))
    end = x.state_dict()
    epoch1 = keys(x)
    x.load_state_dict(middle)
    assert keys(x) == epoch0[3:] and keys(x) == epoch1
    x.load_state_dict(initial)
    assert keys(x) == epoch0 and keys(x) == epoch1
    exhausted = Loader(node, restart_on_stop_iteration=False)
    exhausted.load_state_dict(end)
    assert list(exhausted) == []
    restarting = Loader(node)
    restarting.load_state_dict(end)
    assert keys(restarting) == epoch1
