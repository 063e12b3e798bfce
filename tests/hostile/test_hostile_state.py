"""Hostile saved states: the pipe a state is loaded into decides how far its pass runs (its own ``epochs``), so
``len()`` and what it yields agree; a position it cannot honour, or a field of the wrong type or range, is refused
by name. Plain, mixture and packed (h264) train pipes, and the metric pipe's reader position."""

from __future__ import annotations

import itertools

import pytest
from helpers import make_shards, write_raw

from episodepipes.pipes import EpisodeIndex, Source, metric_pipe
from episodepipes.pipes.train import train_pipe
from episodepipes.sharding.cli import main
from episodepipes.sharding.formats.synthetic import SyntheticReader

SHAPE = dict(num_episodes=6, lengths=(12, 7, 5, 9, 11, 4), height=16, width=24)  # 39 frames: 13 batches of 3
KW = dict(batch_size=3, seed=4, rank=0, world_size=1, num_workers=1)
PER = 13  # batches per epoch


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    return EpisodeIndex.open(make_shards(tmp_path_factory.mktemp("hstate") / "s", shard_size=20_000, **SHAPE))


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    d = tmp_path_factory.mktemp("hstate_mix")
    return (make_shards(d / "a", num_episodes=3, lengths=(9, 5, 6), height=16, width=24, seed=1),
            make_shards(d / "b", num_episodes=2, length=8, height=16, width=24, seed=2))


def _keys(pipe):
    """(episode, frame) of every sample of a pass, reading at most ``len(pipe) + 1`` batches (the old code ran
    one hand-edited state without end)."""
    return [(e, f) for b in itertools.islice(pipe, len(pipe) + 1) for e, f in zip(b["episode"], b["frame"].tolist())]


def _count(pipe):
    return sum(1 for _ in itertools.islice(pipe, len(pipe) + 1))


def _saved(pipe, batches):
    """The pipe's state after ``batches`` batches of its first pass."""
    it = iter(pipe)
    for _ in range(batches):
        next(it)
    return pipe.state_dict()


def _cursor(state):
    """The reader's part of a train pipe's state (one level deeper in a mixture)."""
    got = state["root"]
    while "seed" not in got:
        got = got["source"]
    return got


def _loaded(index, state, **kw):
    pipe = train_pipe(index, **{**KW, **kw})
    pipe.load_state_dict(state)
    return pipe


def test_the_loading_pipes_epochs_win_over_the_saved_count(index):
    """Saved by epochs=3 in epoch 0, loaded into epochs=1: it yields the rest of its one epoch, as len() says
    (the old code yielded the saving pipe's 3 epochs: 38 batches where len() said 13)."""
    state = _saved(train_pipe(index, **KW, epochs=3), 4)
    pipe = _loaded(index, state, epochs=1)
    got = _keys(pipe)
    assert len(got) == (len(pipe) - 4) * 3
    assert got == _keys(train_pipe(index, **KW, epochs=1))[4 * 3:]  # the same batches as an uninterrupted run


def test_a_run_saved_at_2_epochs_is_extended_to_5(index, caplog):
    """save at epochs=2 (in epoch 1), load into epochs=5: the pass runs on to the end of epoch 4 (logged)."""
    state = _saved(train_pipe(index, **KW, epochs=2), PER + 5)
    pipe = _loaded(index, state, epochs=5)
    with caplog.at_level("INFO", logger="episodepipes.pipes.train.state"):
        got = _keys(pipe)
    assert caplog.text.count("resuming a pass of epochs 0 to 1 saved with epochs=2: with epochs=5 it ends before "
                             "epoch 5") == 1
    assert len(got) == (len(pipe) - PER - 5) * 3 == (5 * PER - PER - 5) * 3
    assert got == _keys(train_pipe(index, **KW, epochs=5))[(PER + 5) * 3:]
    assert _cursor(pipe.state_dict())["epoch"] == 5  # and the next iter() starts the next pass there


def test_a_position_past_this_pipes_pass_is_refused(index):
    state = _saved(train_pipe(index, **KW, epochs=3), 2 * PER + 1)  # epoch 2 of a pass from epoch 0
    with pytest.raises(ValueError, match=r"epoch=2, pos=3 of a pass from epoch start=0, past the end of this pipe's "
                                         r"pass \(epochs=1: epochs 0 to 0\); build the pipe with epochs >= 3"):
        _loaded(index, state, epochs=1)
    _loaded(index, state, epochs=3)  # its own epochs hold it


def test_another_runs_state_is_named_by_what_differs_before_its_position(index):
    state = _saved(train_pipe(index, **KW, epochs=3), 2 * PER + 1)
    with pytest.raises(ValueError, match=r"does not fit this pipe: seed=4 in the state, 5 here"):
        _loaded(index, state, epochs=1, seed=5)


def test_a_state_at_the_end_of_a_shorter_pass_starts_the_next_pass(index):
    """Saved by epochs=3 just after epoch 0, loaded into epochs=1: that is the end of the pass, so iter() runs
    the next one (epoch 1), a whole len() of batches."""
    state = _saved(train_pipe(index, **KW, epochs=3), PER)
    pipe = _loaded(index, state, epochs=1)
    got = _keys(pipe)
    ref = train_pipe(index, **KW, epochs=1)
    _keys(ref)
    assert got == _keys(ref) and len(got) == len(pipe) * 3


@pytest.mark.parametrize("edit, match", [
    (dict(stop=10**12), None),  # a hand-made long pass: this pipe's epochs still end it
    (dict(epoch=10**12, stop=10**12 + 1), r"epoch=1000000000000, pos=3 of a pass from epoch start=0, past the end"),
    (dict(epoch=2**63, stop=None), r"epoch=9223372036854775808.*not non-negative ints"),
    (dict(start=5), r"start=5, epoch=0: start, the pass's first epoch, should be an int in \[0, epoch\]"),
    (dict(start=-1), r"start=-1"),
    (dict(start=True), r"start=True"),
    (dict(start=0.0), r"start=0.0"),
    (dict(start=None), r"start=None"),
    (dict(stop=0), r"stop=0 with start=0, epoch=0, pos=3: a pass stops after its start"),
    (dict(epoch=1, stop=1), r"stop=1 with start=0, epoch=1, pos=3"),
    (dict(rank=-1), r"rank=-1, not a rank of its world_size=1"),
    (dict(rank=1), r"rank=1, not a rank of its world_size=1"),
    (dict(rank=True), r"rank=True"),
    (dict(seed=4.0), r"seed=4.0 in the state, 4 here"),
    (dict(seed=True, consumed=3), None),  # seed=1 pipe below
    (dict(frames=39.0), r"frames=39.0 in the state, 39 here"),
    (dict(pos=1.0), r"pos=1.0.*not non-negative ints"),
])
def test_a_hand_edited_field_is_range_checked_against_the_pipe(index, edit, match):
    state = _saved(train_pipe(index, **KW, epochs=1), 1)
    _cursor(state).update(edit)
    if edit.get("seed") is True:
        with pytest.raises(ValueError, match=r"seed=True in the state, 1 here\. Build the pipe with the checkpoint"):
            _loaded(index, state, epochs=1, seed=1)
        return
    if match is None:
        pipe = _loaded(index, state, epochs=1)
        assert len(_keys(pipe)) == (len(pipe) - 1) * 3  # it ends where len() says, not at the saved stop
        return
    with pytest.raises(ValueError, match=match) as e:
        _loaded(index, state, epochs=1)
    assert "\n" not in str(e.value)


def test_an_endless_pipe_keeps_its_own_end_too(index):
    """A state saved by an endless pass loads into epochs=1 as a pass of one epoch from where that pass began."""
    state = _saved(train_pipe(index, **KW, epochs=None), 2)
    pipe = _loaded(index, state, epochs=1)
    assert len(_keys(pipe)) == (len(pipe) - 2) * 3
    late = _saved(train_pipe(index, **KW, epochs=None), PER + 2)
    with pytest.raises(ValueError, match=r"past the end of this pipe's pass \(epochs=1"):
        _loaded(index, late, epochs=1)


def test_a_state_saved_before_start_was_recorded_still_resumes_its_own_pass(index):
    """No ``start`` (an older episodepipes): the pass is taken to have this pipe's epochs (it ends at the saved
    stop); one that cannot hold the saved epoch is refused naming stop and the fix."""
    state = _saved(train_pipe(index, **KW, epochs=2), PER + 1)
    del _cursor(state)["start"]
    pipe = _loaded(index, state, epochs=2)
    assert _keys(pipe) == _keys(train_pipe(index, **KW, epochs=2))[(PER + 1) * 3:]
    with pytest.raises(ValueError, match=r"stop=2 and no start \(saved by an older episodepipes\), and with this "
                                         r"pipe's epochs=3 its pass would begin at epoch -1, which does not hold its "
                                         r"epoch=1; build the pipe with the epochs= the checkpoint was saved with"):
        _loaded(index, state, epochs=3)


def test_a_mixture_goes_through_the_same_checks(roots):
    mix = {"a": Source(roots[0], 2), "b": Source(roots[1], 1)}
    kw = dict(KW, batch_size=2)
    saver = train_pipe(mix, **kw, epochs=3)
    per = len(saver) // 3
    state = _saved(saver, 2)
    pipe = train_pipe(mix, **kw, epochs=1)
    pipe.load_state_dict(state)
    assert _count(pipe) == len(pipe) - 2  # the old code ran the saving pipe's 3 epochs
    late = _saved(train_pipe(mix, **kw, epochs=3), per + 1)
    with pytest.raises(ValueError, match=r"past the end of this pipe's pass \(epochs=1.*epochs >= 2"):
        train_pipe(mix, **kw, epochs=1).load_state_dict(late)
    _cursor(state)["rank"] = 7
    with pytest.raises(ValueError, match=r"rank=7, not a rank of its world_size=1"):
        train_pipe(mix, **kw, epochs=3).load_state_dict(state)


def test_packed_video_shards_go_through_the_same_checks(tmp_path):
    src = write_raw(tmp_path / "src", SyntheticReader(num_episodes=2, length=6, height=32, width=48))
    out = tmp_path / "h264"
    assert main(["write", str(src), str(out), "--workers", "1", "--codec", "h264", "--gop", "2"]) == 0
    kw = dict(KW, batch_size=2)
    state = _saved(train_pipe(out, **kw, epochs=3), 1)  # 12 frames: 6 batches per epoch
    pipe = train_pipe(out, **kw, epochs=1)
    pipe.load_state_dict(state)
    assert _count(pipe) == len(pipe) - 1 == 5
    late = _saved(train_pipe(out, **kw, epochs=3), 7)
    with pytest.raises(ValueError, match=r"epoch=1, pos=2 of a pass from epoch start=0, past the end"):
        train_pipe(out, **kw, epochs=1).load_state_dict(late)


@pytest.mark.parametrize("pos, match", [(-3, r"pos=-3"), (True, r"pos=True"), (2.0, r"pos=2.0"),
                                        (10**12, r"pos=1000000000000")])
def test_a_metric_pipes_position_is_range_checked(index, pos, match):
    """A negative position read the pass's tail; one past the end gave an empty pass; both silently."""
    def build():
        return metric_pipe(index, split="train", frames_per_episode=4, batch_size=4, rank=0, world_size=1,
                           num_workers=1)

    state = _saved(build(), 1)
    reader = state["root"]["upstream"]
    while "pos" not in reader:
        reader = reader["source"]
    reader["pos"] = pos
    pipe = build()
    pipe.load_state_dict(state)
    with pytest.raises(ValueError, match=match + r", not an int in \[0, 16\] \(the 16 items of this pipe's pass\); "
                                                 r"pass the state_dict\(\) of a pipe built with the same arguments"):
        list(itertools.islice(pipe, 2))
