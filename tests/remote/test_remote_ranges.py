"""Coalescing ranges into GETs: every range is covered once, requests stay bounded, waste is bounded by the gap."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from episodepipes.remote.ranges import check_ranges, coalesce

ranges_st = st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 2_000)), max_size=40)


@given(ranges_st, st.integers(0, 3_000), st.integers(1, 20_000))
def test_each_range_is_inside_exactly_one_request(ranges, gap, max_request):
    reqs = coalesce(ranges, gap=gap, max_request=max_request)
    members = sorted(i for r in reqs for i in r.members)
    assert members == [i for i, (_, n) in enumerate(ranges) if n > 0]
    for r in reqs:
        assert all(r.start <= ranges[i][0] and ranges[i][0] + ranges[i][1] <= r.end for i in r.members)
        assert r.end - r.start <= max_request or len(r.members) == 1
        # the GET holds the members' union plus at most one gap between consecutive members
        covered: set[int] = set()
        for i in r.members:
            covered.update(range(ranges[i][0], ranges[i][0] + ranges[i][1]))
        assert (r.end - r.start) - len(covered) <= gap * (len(r.members) - 1)


@given(st.lists(st.integers(1, 5_000), min_size=1, max_size=30), st.integers(0, 100))
def test_adjacent_ranges_are_one_request(sizes, start):
    offsets = [start + sum(sizes[:i]) for i in range(len(sizes))]
    reqs = coalesce(list(zip(offsets, sizes)), gap=0, max_request=sum(sizes))
    assert [(r.start, r.end, r.members) for r in reqs] == [(start, start + sum(sizes), tuple(range(len(sizes))))]


def test_far_apart_ranges_and_the_size_cap_split_requests():
    assert [(r.start, r.end) for r in coalesce([(0, 10), (100, 10)], gap=89, max_request=1000)] == [(0, 10), (100, 110)]
    assert [(r.start, r.end) for r in coalesce([(0, 10), (100, 10)], gap=90, max_request=1000)] == [(0, 110)]
    assert [(r.start, r.end) for r in coalesce([(0, 10), (10, 10), (20, 10)], gap=0, max_request=20)] == [(0, 20),
                                                                                                         (20, 30)]


@pytest.mark.parametrize("bad", [[(0, -1)], [(-5, 1)], [(0,)], [(0.5, 1)], [(True, 1)], ["ab"]])
def test_bad_ranges_are_refused_by_index(bad):
    with pytest.raises(ValueError, match=r"ranges\[0\]"):
        check_ranges(bad)


@given(ranges_st, st.integers(0, 3_000), st.integers(1, 20_000), st.sampled_from([0.0, 0.05, 0.1, 0.5]))
def test_waste_bounds_every_requests_dropped_bytes_by_a_fraction_of_its_own(ranges, gap, max_request, waste):
    reqs = coalesce(ranges, gap=gap, max_request=max_request, waste=waste)
    assert sorted(i for r in reqs for i in r.members) == [i for i, (_, n) in enumerate(ranges) if n > 0]
    for r in reqs:
        covered: set[int] = set()
        for i in r.members:
            covered.update(range(ranges[i][0], ranges[i][0] + ranges[i][1]))
        assert (r.end - r.start) - len(covered) <= waste * len(covered)


def test_a_sparse_plan_is_not_read_through_but_small_gaps_still_are():
    frames = [(k * 3000, 1000) for k in range(10)]  # a frame in every 3: gaps twice the frames
    assert len(coalesce(frames, gap=64 * 1024, max_request=1 << 24)) == 1  # gap alone reads 3x the bytes
    assert len(coalesce(frames, gap=64 * 1024, max_request=1 << 24, waste=0.1)) == 10
    headers = [(k * 1000 + 50, 950) for k in range(10)]  # 50-byte headers skipped: 5% waste, one GET
    assert [(r.start, r.end) for r in coalesce(headers, gap=64 * 1024, max_request=1 << 24, waste=0.1)] == [(50, 10000)]
