import pickle
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from episodepipes.pipes.order.mixture import Mixture
from episodepipes.pipes.order.permute import IndexShuffle, rank_positions, steps_per_epoch

weights = st.lists(st.integers(1, 30), min_size=1, max_size=7)


def _mix(ws, sizes=None, stop="cycle"):
    names = [f"s{i}" for i in range(len(ws))]
    return Mixture.of(dict(zip(names, ws)), dict(zip(names, sizes or [50] * len(ws))), stop=stop)


def _sources(m, n):
    return np.array([m.locate(g)[0] for g in range(n)])


@given(ws=weights, length=st.integers(1, 400))
@settings(max_examples=60, deadline=None)
def test_every_window_holds_each_share_within_the_stated_bound(ws, length):
    m = _mix(ws)
    src = _sources(m, 600)
    for i, w in enumerate(m.weights):
        c = np.concatenate([[0], np.cumsum(src == i)])
        counts = c[length:] - c[:-length]  # every window of this length, at every start
        b = m.bound(i)
        # |count - w*N| < bound, in exact integers: w = a/d, bound = u/v
        dev = np.abs(counts * w.denominator - w.numerator * length)
        assert (dev * b.denominator < b.numerator * w.denominator).all(), (i, w, b)


@given(a=st.integers(1, 1000), b=st.integers(1, 1000), length=st.integers(1, 300), start=st.integers(0, 10**12))
@settings(deadline=None)
def test_two_sources_are_within_one_sample_over_any_window_even_far_out(a, b, length, start):
    m = _mix([a, b])
    assert m.bound(0) == m.bound(1) == 1
    count = sum(m.locate(g)[0] == 0 for g in range(start, start + length))
    assert abs(count - Fraction(a, a + b) * length) < 1


def test_float_weights_mean_their_decimal_value_so_every_five_samples_hold_three_and_two():
    m = Mixture.of({"droid": 0.6, "aloha": 0.4}, {"droid": 1000, "aloha": 10})
    assert m.weights == (Fraction(3, 5), Fraction(2, 5))
    src = _sources(m, 1000)
    c = np.concatenate([[0], np.cumsum(src == 0)])
    assert set((c[5:] - c[:-5]).tolist()) == {3}


@given(ws=weights, gs=st.lists(st.integers(0, 10**15), min_size=1, max_size=20))
@settings(deadline=None)
def test_locate_and_position_are_inverse_and_agree_with_counts(ws, gs):
    m = _mix(ws)
    for g in gs:
        s, k = m.locate(g)
        assert m.position(s, k) == g
        assert m.counts(g)[s] == k  # k samples of s come before g
        assert sum(m.counts(g)) == g
    src, ks = m.locate_many(np.array(gs))
    assert [(int(a), int(b)) for a, b in zip(src, ks)] == [m.locate(g) for g in gs]


@given(ws=weights, sizes=st.lists(st.integers(1, 60), min_size=7, max_size=7))
@settings(deadline=None)
def test_len_follows_the_stop_rule(ws, sizes):
    sizes = sizes[: len(ws)]
    cyc, first = _mix(ws, sizes, "cycle"), _mix(ws, sizes, "first_exhausted")
    n = len(cyc)
    assert all(c >= s for c, s in zip(cyc.counts(n), sizes))  # every sample seen at least once
    assert any(c < s for c, s in zip(cyc.counts(n - 1), sizes))  # and not one sample earlier
    n = len(first)
    assert all(c <= s for c, s in zip(first.counts(n), sizes))  # nothing repeated
    s, k = first.locate(n)
    assert k == sizes[s]  # the next sample would be a repeat


def test_a_cycled_source_restarts_in_a_new_order_and_each_pass_covers_it_once():
    m = Mixture.of({"big": 1, "small": 1}, {"big": 40, "small": 7}, stop="cycle")
    assert len(m) == 79  # big's 40th sample is at 78
    seen: dict[tuple[int, int], list[int]] = {}
    for g in range(len(m)):
        s, p, i = m.draw(g)
        seen.setdefault((s, p), []).append(int(IndexShuffle.of(m.sizes[s], seed=9, epoch=0, stream=(s, p))(i)))
    assert sorted(seen[(0, 0)]) == list(range(40))
    for p in range(5):
        assert sorted(seen[(1, p)]) == list(range(7))  # five full passes of the small source
    assert seen[(1, 0)] != seen[(1, 1)]
    g = np.arange(len(m))
    assert not np.array_equal(m.samples(g, seed=9, epoch=0)[1], m.samples(g, seed=9, epoch=1)[1])
    one_by_one = [IndexShuffle.of(m.sizes[s], seed=9, epoch=0, stream=(s, p))(i) for s, p, i in map(m.draw, g)]
    assert np.array_equal(m.samples(g, seed=9, epoch=0)[1], one_by_one)


@given(ws=weights, sizes=st.lists(st.integers(1, 40), min_size=7, max_size=7), seed=st.integers(0, 99),
       stop=st.sampled_from(["cycle", "first_exhausted"]))
@settings(deadline=None)
def test_an_epoch_of_samples_covers_each_source_pass_once_and_is_a_pure_function(ws, sizes, seed, stop):
    m = _mix(ws, sizes[: len(ws)], stop)
    g = np.arange(len(m))
    src, ids = m.samples(g, seed=seed, epoch=2)
    for s, n in enumerate(m.sizes):
        got = ids[src == s]
        full, rest = divmod(len(got), n)
        for p in range(full):  # every full pass is a permutation of the source
            assert sorted(got[p * n:(p + 1) * n].tolist()) == list(range(n))
        assert len(set(got[full * n:].tolist())) == rest
        if stop == "cycle":
            assert full >= 1
        else:
            assert full <= 1
    part = np.array([len(m) - 1, 0, len(m) // 2])  # any positions, in any order, give the same answer
    assert [a.tolist() for a in m.samples(part, seed=seed, epoch=2)] == [src[part].tolist(), ids[part].tolist()]


@given(ws=weights, world=st.integers(1, 4), batch=st.integers(1, 8))
@settings(deadline=None)
def test_every_rank_gets_the_same_batches_and_a_global_step_holds_the_shares(ws, world, batch):
    m = _mix(ws, [30] * len(ws))
    steps = steps_per_epoch(len(m), world_size=world, batch_size=batch)
    g = world * batch
    for step in range(min(steps, 5)):
        per_rank = [m.locate_many(rank_positions(step, rank=r, world_size=world, batch_size=batch))[0]
                    for r in range(world)]
        assert all(len(p) == batch for p in per_rank)
        got = np.bincount(np.concatenate(per_rank), minlength=len(ws))
        for i, w in enumerate(m.weights):
            assert abs(got[i] - w * g) < m.bound(i)


def test_one_source_is_the_identity_and_the_schedule_pickles():
    m = Mixture.of({"only": 2.5}, {"only": 10})
    assert [m.locate(g) for g in range(3)] == [(0, 0), (0, 1), (0, 2)] and len(m) == 10 and m.bound(0) == 1
    m = _mix([3, 1, 4, 1, 5])
    assert pickle.loads(pickle.dumps(m)) == m


@pytest.mark.parametrize(("weights", "sizes", "stop", "match"), [
    ({"a": 1}, {"b": 1}, "cycle", "should name the same sources"),
    ({}, {}, "cycle", "at least one"),
    ({"a": 0}, {"a": 1}, "cycle", "'a'=0 should be positive"),
    ({"a": -0.5}, {"a": 1}, "cycle", "'a'=-0.5 should be positive"),
    ({"a": "1"}, {"a": 1}, "cycle", "'a'='1' should be a positive number"),
    ({"a": 1}, {"a": 0}, "cycle", "size of 'a'=0"),
    ({"a": 1}, {"a": 1}, "all", "stop='all'"),
    ({"a": float("nan"), "b": 1}, {"a": 1, "b": 1}, "cycle", "'a'=nan should be a finite positive number"),
    ({"a": float("inf"), "b": 1}, {"a": 1, "b": 1}, "cycle", "'a'=inf should be a finite positive number"),
    ({"a": 1, "b": np.float32("-inf")}, {"a": 1, "b": 1}, "cycle", r"'b'=np.float32\(-inf\) should be a finite"),
    ({"a": 1, "b": np.bool_(True)}, {"a": 1, "b": 1}, "cycle", "'b'=np.True_ should be a positive number"),
    ({"a": 1e308, "b": 1}, {"a": 1, "b": 1}, "cycle",
     "'a'=1e[+]308 is more than 1000000000 times that of 'b'=1; keep the weights within a ratio of 1000000000"),
    ({"a": 1, "b": 1e-12}, {"a": 1, "b": 1}, "cycle", "'a'=1 is more than 1000000000 times that of 'b'=1e-12"),
    ({"a": 10**9, "b": 1}, {"a": 1, "b": 2**40}, "cycle", rf"makes an epoch of \d{{22}} samples, more "
     rf"than {2**62}; bring the weights closer")])
def test_bad_mixtures_are_refused_by_name(weights, sizes, stop, match):
    with pytest.raises(ValueError, match=match):
        Mixture.of(weights, sizes, stop=stop)


def test_weights_a_billion_apart_still_mix_exactly():
    m = Mixture.of({"a": 10**9, "b": 1}, {"a": 10, "b": 10})
    q = 10**9 + 1  # b's share is 1/q: one in every q samples, exactly
    assert m.counts(10 * q) == [10 * 10**9, 10]
    assert 9 * q < len(m) <= 10 * q and m.locate(len(m) - 1) == (1, 9)  # the epoch ends at b's tenth sample
