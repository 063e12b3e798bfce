"""Resume of a train_pipe mixture: exact mid-epoch, elastic across world sizes at one global batch, and a changed
mixture (weights, sources, stop rule) refused by name."""

import itertools
import json

import pytest
from helpers import make_shards

from episodepipes.pipes import Source
from episodepipes.pipes.train import train_pipe

KW = dict(seed=4, num_workers=1, history={"state": 2}, epochs=2)
SIZES = [(1, 6), (2, 3), (3, 2)]  # W = 1, 2, 3 at the same global batch of 6


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    d = tmp_path_factory.mktemp("mixresume")
    return (make_shards(d / "a", num_episodes=4, lengths=(9, 5, 6, 7), height=16, width=24, seed=1),
            make_shards(d / "b", num_episodes=3, length=8, height=16, width=24, seed=2))


def _mix(roots, wa=2, wb=1):
    return {"a": Source(roots[0], wa), "b": Source(roots[1], wb)}


def _pipes(roots, world, batch, state=None, mix=None, **kw):
    out = []
    for rank in range(world):
        pipe = train_pipe(mix or _mix(roots), **{**KW, **kw}, batch_size=batch, rank=rank, world_size=world)
        if state is not None:
            pipe.load_state_dict(state)
        out.append(pipe)
    return out


def _steps(pipes, steps=None):
    """Each global step's samples (sorted over the ranks), and each rank's state after them."""
    per_rank = [[list(zip(b["source"], b["episode"], b["frame"].tolist())) for b in itertools.islice(iter(p), steps)]
                for p in pipes]
    assert len({len(b) for b in per_rank}) == 1  # every rank has the same number of batches
    return [sorted(x for r in per_rank for x in r[s]) for s in range(len(per_rank[0]))], [p.state_dict()
                                                                                         for p in pipes]


def test_a_mid_epoch_state_resumes_the_same_batches(roots):
    (pipe,) = _pipes(roots, 1, 4)
    want = [list(zip(b["source"], b["episode"], b["frame"].tolist())) for b in pipe]
    (pipe,) = _pipes(roots, 1, 4)
    it = iter(pipe)
    head = [list(zip(b["source"], b["episode"], b["frame"].tolist())) for b in itertools.islice(it, 3)]
    state = json.loads(json.dumps(pipe.state_dict()))  # a state through JSON resumes as well
    (again,) = _pipes(roots, 1, 4, state=state)
    rest = [list(zip(b["source"], b["episode"], b["frame"].tolist())) for b in again]
    assert head + rest == want and len(want) == len(pipe)


@pytest.mark.parametrize("old, new", [(a, b) for a in SIZES for b in SIZES if a != b])
@pytest.mark.parametrize("stop", [2, 5])  # mid-epoch 0, into epoch 1
def test_a_mixture_state_resumes_exactly_at_another_world_size(roots, old, new, stop):
    want, _ = _steps(_pipes(roots, *new))
    head, states = _steps(_pipes(roots, *old), stop)
    assert head == want[:stop]
    for state in (states[0], states[-1]):  # rank 0's, as Lightning saves, or any other rank's
        rest, _ = _steps(_pipes(roots, *new, state=state))
        assert head + rest == want


def test_the_three_world_sizes_give_one_stream_of_steps(roots):
    streams = [_steps(_pipes(roots, w, b))[0] for w, b in SIZES]
    assert streams[0] == streams[1] == streams[2] and len(streams[0]) == len(_pipes(roots, 1, 6)[0])


@pytest.mark.parametrize("change, why", [
    (dict(mix="weights"), r"weights=\{'a': '2/3', 'b': '1/3'\} in the state, \{'a': '1/2', 'b': '1/2'\} here.*"
                          r"checkpoint's weights"),
    (dict(mix="sources"), r"sources=\['a', 'b'\] in the state, \['b', 'a'\] here.*checkpoint's sources"),
    (dict(stop="first_exhausted"), r"stop_rule='cycle' in the state, 'first_exhausted' here.*stop= rule"),
    (dict(mix="one"), r"the saved train state is a mixture's and this pipe is a train_pipe of one source"),
])
def test_a_changed_mixture_is_refused_by_name(roots, change, why):
    _, (state,) = _steps(_pipes(roots, 1, 6), 2)
    mix = {"weights": _mix(roots, 1, 1), "sources": {"b": Source(roots[1], 1), "a": Source(roots[0], 2)},
           "one": None}.get(change.get("mix"), _mix(roots))
    kw = {k: v for k, v in change.items() if k != "mix"}
    with pytest.raises(ValueError, match=why):
        if change.get("mix") == "one":  # a pipe of one source refuses a mixture's state, and the other way round
            train_pipe(roots[0], **KW, batch_size=6, rank=0, world_size=1).load_state_dict(state)
        else:
            _pipes(roots, 1, 6, state=state, mix=mix, **kw)
    one = train_pipe(roots[0], **KW, batch_size=6, rank=0, world_size=1)
    with pytest.raises(ValueError, match=r"is a train_pipe of one source's and this pipe is a mixture; resume"):
        _pipes(roots, 1, 6, state=one.state_dict())


def test_a_state_at_the_end_of_a_pass_starts_the_next_pass(roots):
    (pipe,) = _pipes(roots, 1, 6, epochs=1)
    first = [b["frame"].tolist() for b in pipe]
    (again,) = _pipes(roots, 1, 6, epochs=1, state=pipe.state_dict())
    second = [b["frame"].tolist() for b in again]
    assert len(second) == len(first) and second != first
