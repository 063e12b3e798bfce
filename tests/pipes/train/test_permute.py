import logging
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from episodepipes.pipes.order.permute import (
    IndexShuffle,
    elastic_state,
    global_position,
    rank_positions,
    rank_samples,
    resume_point,
    shuffle_many,
    steps_per_epoch,
)

SPECIAL = [1, 2, 3, 4, 5, 7, 8, 9, 13, 15, 16, 17, 31, 33, 63, 64, 65, 97, 127, 129, 255, 257, 1023, 1025, 4099]


@pytest.mark.parametrize("n", SPECIAL)
def test_the_shuffle_is_a_bijection_of_range_n_and_inverse_undoes_it(n):
    p = IndexShuffle.of(n, seed=7, epoch=3)
    y = p(np.arange(n))
    assert y.dtype == np.int64
    assert np.array_equal(np.sort(y), np.arange(n))
    assert np.array_equal(p.inverse(y), np.arange(n))
    assert [p(i) for i in range(n)] == y.tolist()  # the scalar path is the same permutation


@given(n=st.integers(1, 3000), seed=st.integers(0, 2**63), epoch=st.integers(0, 2**20))
@settings(max_examples=60, deadline=None)
def test_any_n_and_key_give_a_bijection(n, seed, epoch):
    y = IndexShuffle.of(n, seed=seed, epoch=epoch)(np.arange(n))
    assert np.array_equal(np.sort(y), np.arange(n))


def test_a_block_of_positions_is_the_same_as_the_whole_order_and_state_is_a_few_ints():
    n = 1_000_003
    p = IndexShuffle.of(n, seed=1, epoch=0)
    whole = p(np.arange(n))
    assert np.array_equal(p(np.arange(500_000, 500_256)), whole[500_000:500_256])
    assert np.array_equal(p(np.array([[3, 9], [n - 1, 0]])), whole[[[3, 9], [n - 1, 0]]])
    assert len(pickle.dumps(p)) < 300 and pickle.loads(pickle.dumps(p)) == p


def test_the_order_depends_on_seed_epoch_and_stream_and_looks_shuffled():
    n = 10_000
    a = IndexShuffle.of(n, seed=3, epoch=1)(np.arange(n))
    assert np.array_equal(a, IndexShuffle.of(n, seed=3, epoch=1)(np.arange(n)))
    for other in ({"seed": 4, "epoch": 1}, {"seed": 3, "epoch": 2}, {"seed": 3, "epoch": 1, "stream": (5,)}):
        assert (a != IndexShuffle.of(n, **other)(np.arange(n))).mean() > 0.99
    assert (a == np.arange(n)).sum() < 20  # about one fixed point expected
    assert abs(np.corrcoef(np.arange(n), a)[0, 1]) < 0.05


def test_positions_outside_the_domain_are_refused():
    p = IndexShuffle.of(10, seed=0, epoch=0)
    with pytest.raises(IndexError, match=r"\[0, 10\)"):
        p(np.array([0, 10]))
    with pytest.raises(IndexError, match=r"\[0, 10\)"):
        p(-1)
    with pytest.raises(ValueError, match="seed=-1"):
        IndexShuffle.of(10, seed=-1, epoch=0)


@given(world=st.integers(1, 6), batch=st.integers(1, 6), step=st.integers(0, 50))
@settings(deadline=None)
def test_the_ranks_of_a_step_take_exactly_its_global_block(world, batch, step):
    g = world * batch
    parts = [rank_positions(step, rank=r, world_size=world, batch_size=batch) for r in range(world)]
    assert all(len(p) == batch for p in parts)
    assert sorted(np.concatenate(parts).tolist()) == list(range(step * g, (step + 1) * g))
    assert parts[world - 1][batch - 1] == global_position(step, rank=world - 1, index=batch - 1, world_size=world,
                                                          batch_size=batch)


@given(n=st.integers(0, 400), world=st.integers(1, 6), batch=st.integers(1, 8), seed=st.integers(0, 99))
@settings(deadline=None)
def test_drop_last_keeps_every_rank_even_and_drops_less_than_a_global_batch(n, world, batch, seed):
    steps = steps_per_epoch(n, world_size=world, batch_size=batch)
    if n == 0:
        return
    p = IndexShuffle.of(n, seed=seed, epoch=0)
    seen = [rank_samples(p, s, rank=r, world_size=world, batch_size=batch) for r in range(world) for s in range(steps)]
    flat = np.concatenate(seen or [np.zeros(0, np.int64)]).tolist()
    assert len(flat) == len(set(flat)) == steps * world * batch
    assert n - len(flat) < world * batch
    with pytest.raises(IndexError, match="past the epoch"):
        rank_samples(p, steps, rank=0, world_size=world, batch_size=batch)


def _run(n, *, epoch, step, world, batch, steps):
    """``steps`` global steps of an uninterrupted run from (epoch, step): (epoch, step, sorted sample ids)."""
    out = []
    while len(out) < steps:
        per = steps_per_epoch(n, world_size=world, batch_size=batch)
        if step >= per:
            epoch, step = epoch + 1, 0
            continue
        perm = IndexShuffle.of(n, seed=5, epoch=epoch)
        block = [rank_samples(perm, step, rank=r, world_size=world, batch_size=batch) for r in range(world)]
        out.append((epoch, step, sorted(np.concatenate(block).tolist())))
        step += 1
    return out


SIZES = [(1, 12), (2, 6), (3, 4), (4, 3), (6, 2), (12, 1), (1, 6), (2, 3), (3, 2), (1, 4), (2, 2)]


@given(n=st.integers(12, 200), sizes=st.lists(st.sampled_from(SIZES), min_size=2, max_size=5),
       cuts=st.lists(st.integers(0, 25), min_size=4, max_size=4))
@settings(max_examples=80, deadline=None)
def test_resume_across_world_and_batch_sizes_continues_the_stream_exactly(n, sizes, cuts):
    """Legs at different (W, B), each resumed from the last one's checkpoint: together they consume each
    epoch's global stream as one contiguous prefix, with nothing repeated or skipped."""
    epoch, step, (world, batch) = 0, 0, sizes[0]
    blocks = []
    for (w2, b2), cut in zip(sizes[1:], cuts):
        run = _run(n, epoch=epoch, step=step, world=world, batch=batch, steps=cut)
        blocks += run
        if run:
            epoch, step = run[-1][0], run[-1][1] + 1
        state = elastic_state(seed=5, epoch=epoch, step=step, world_size=world, batch_size=batch, n=n)
        try:
            epoch, step = resume_point(state, world_size=w2, batch_size=b2, n=n, seed=5)
        except ValueError as e:
            assert state["consumed"] % (w2 * b2) and "does not divide it" in str(e)
            break
        world, batch = w2, b2
    by_epoch = {}
    for e, _, block in blocks:
        by_epoch.setdefault(e, []).extend(block)
    for e, got in by_epoch.items():
        assert len(set(got)) == len(got)
        assert sorted(got) == sorted(IndexShuffle.of(n, seed=5, epoch=e)(np.arange(len(got))).tolist())


def test_resume_with_the_same_global_batch_is_exact_at_any_world_size():
    n = 120
    state = elastic_state(seed=1, epoch=2, step=7, world_size=2, batch_size=6, n=n)
    assert state == {"seed": 1, "epoch": 2, "consumed": 84, "global_batch": 12, "n": n}
    for w, b in ((1, 12), (3, 4), (4, 3), (12, 1)):
        assert resume_point(state, world_size=w, batch_size=b, n=n, seed=1) == (2, 84 // 12)
    assert resume_point(state, world_size=7, batch_size=3, n=n, seed=1) == (2, 4)  # 21 divides 84: exact too
    assert resume_point(state, world_size=7, batch_size=6, n=n, seed=1) == (3, 0)  # 42 does, but 84 ends its epoch
    end = elastic_state(seed=1, epoch=2, step=10, world_size=2, batch_size=6, n=n)  # the epoch's last step
    assert resume_point(end, world_size=3, batch_size=4, n=n, seed=1) == (3, 0)


def test_a_global_batch_that_does_not_divide_the_position_is_refused_or_skips_ahead_loudly(caplog):
    state = elastic_state(seed=1, epoch=0, step=5, world_size=2, batch_size=4, n=100)  # consumed 40
    with pytest.raises(ValueError, match=r"consumed 40 samples of epoch 0 at global batch 8; "
                                         r"world_size\*batch_size=3\*4=12 does not divide it"):
        resume_point(state, world_size=3, batch_size=4, n=100, seed=1)
    with caplog.at_level(logging.WARNING):
        assert resume_point(state, world_size=3, batch_size=4, n=100, seed=1, on_mismatch="next_step") == (0, 4)
        assert "8 samples skipped" in caplog.text
        assert resume_point(state, world_size=3, batch_size=4, n=100, seed=1, on_mismatch="next_epoch") == (1, 0)


@pytest.mark.parametrize(("change", "match"), [
    ({"seed": 2}, "seed=2"), ({"n": 99}, "n=99"), ({"on_mismatch": "round"}, "on_mismatch='round'")])
def test_resume_refuses_another_seed_dataset_or_policy(change, match):
    state = elastic_state(seed=1, epoch=0, step=5, world_size=2, batch_size=4, n=100)
    kw = {"world_size": 2, "batch_size": 4, "n": 100, "seed": 1} | change
    with pytest.raises(ValueError, match=match):
        resume_point(state, **kw)


@pytest.mark.parametrize(("state", "match"), [
    ({"seed": 1}, "should have keys"), ("x", "should have keys"),
    ({"seed": 1, "epoch": 0, "consumed": 3, "global_batch": 8, "n": 100}, "multiple of"),
    ({"seed": 1, "epoch": 0, "consumed": 800, "global_batch": 8, "n": 100}, "at most n=100"),
    ({"seed": 1, "epoch": -1, "consumed": 8, "global_batch": 8, "n": 100}, r"state\['epoch'\]=-1"),
    ({"seed": 1, "epoch": 0, "consumed": 8.0, "global_batch": 8, "n": 100}, r"state\['consumed'\]=8.0"),
    ({"seed": 1, "epoch": True, "consumed": 8, "global_batch": 8, "n": 100}, r"state\['epoch'\]=True"),
    ({"seed": 1, "epoch": 0, "consumed": 0, "global_batch": 0, "n": 100}, r"state\['global_batch'\]=0")])
def test_a_hostile_resume_state_is_refused_by_name(state, match):
    with pytest.raises(ValueError, match=match):
        resume_point(state, world_size=2, batch_size=4, n=100, seed=1)


@given(ns=st.lists(st.integers(1, 5000), min_size=1, max_size=6), seed=st.integers(0, 99),
       picks=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 10**6)), max_size=200))
@settings(deadline=None)
def test_shuffle_many_is_each_positions_own_shuffle(ns, seed, picks):
    shuffles = [IndexShuffle.of(n, seed=seed, epoch=1, stream=(i,)) for i, n in enumerate(ns)]
    which = np.array([w % len(ns) for w, _ in picks], np.int64)
    pos = np.array([p % ns[w] for w, p in zip(which, (p for _, p in picks))], np.int64)
    got = shuffle_many(shuffles, which, pos)
    assert got.tolist() == [shuffles[w](int(p)) for w, p in zip(which, pos)]


def test_shuffle_many_refuses_positions_outside_their_own_domain():
    shuffles = [IndexShuffle.of(5, seed=0, epoch=0), IndexShuffle.of(50, seed=0, epoch=0)]
    with pytest.raises(IndexError, match="each one's shuffle"):
        shuffle_many(shuffles, np.array([1, 0]), np.array([7, 7]))
    with pytest.raises(ValueError, match="an index into the 2 shuffles"):
        shuffle_many(shuffles, np.array([2]), np.array([0]))


@pytest.mark.parametrize(("n", "critical"), [(5, 18.5), (12, 31.3), (200, 268.0), (1000, 1143.0)])
def test_where_a_position_lands_is_uniform_over_seeds(n, critical):
    """Chi-square of where positions 0 and n-1 land over 3000 seeds, against the p=0.001 critical value
    (seeds fixed, so not flaky); a Feistel net on a 3-bit domain fails this at n=5."""
    seeds = 3000
    ys = np.array([IndexShuffle.of(n, seed=s, epoch=0)(np.array([0, n - 1])) for s in range(seeds)])
    for col in ys.T:
        counts = np.bincount(col, minlength=n)
        assert ((counts - seeds / n) ** 2 / (seeds / n)).sum() < critical
