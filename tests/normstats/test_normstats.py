import copy
import json
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from episodepipes.normstats import QUANTILES, REL_ERROR, ArrayStats, StatsTable

finite = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False, width=32)
arrays = hnp.arrays(np.float32, st.tuples(st.integers(1, 80), st.integers(1, 4)), elements=finite)


def _stats(x):
    s = ArrayStats(x.shape[1:])
    s.add(x)
    return s


def _check_against_numpy(x, s):
    x64 = x.astype(np.float64).reshape(len(x), *s.shape)
    got = s.summary()
    scale = max(1.0, float(np.abs(x64).max()))
    assert got["count"] == len(x)
    np.testing.assert_allclose(got["mean"], x64.mean(0), rtol=0, atol=1e-13 * scale)
    np.testing.assert_allclose(got["std"], x64.std(0), rtol=1e-9, atol=1e-12 * scale)
    assert np.array_equal(got["min"], x64.min(0)) and np.array_equal(got["max"], x64.max(0))
    for name, q in QUANTILES.items():
        ref = np.quantile(x64, q, axis=0, method="lower")
        assert (np.abs(got[name] - ref) <= REL_ERROR * np.abs(ref)).all(), (name, got[name], ref)


@given(x=arrays)
@settings(deadline=None)
def test_summary_matches_numpy_on_the_raw_arrays(x):
    _check_against_numpy(x, _stats(x))


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.int16, np.uint8, np.int64])
def test_every_numeric_dtype_and_a_multi_dimensional_step_shape(dtype):
    rng = np.random.default_rng(1)
    x = (rng.normal(0, 50, (3000, 2, 3)) * np.array([1, 10, 1e-3])).astype(dtype)
    if np.dtype(dtype).kind == "u":
        x = rng.integers(0, 255, (3000, 2, 3)).astype(dtype)
    _check_against_numpy(x, _stats(x))


def test_sums_are_exact_where_float_accumulation_is_not():
    s = _stats(np.array([[1e16], [1.0], [-1e16]]))
    assert s.summary()["mean"][0] == 1 / 3  # a float64 running sum loses the 1.0 and says 0
    s = _stats(np.array([[1e308], [1e308]]))
    assert s.summary()["mean"][0] == 1e308 and s.summary()["std"][0] == 0  # a plain sum overflows to inf
    tiny = np.array([[5e-324], [1e-310], [-2.5e-320]])
    np.testing.assert_equal(_stats(tiny).summary()["min"], [-2.5e-320])


def test_a_constant_dimension_has_zero_std_and_exact_quantiles():
    x = np.column_stack([np.full(100, 0.25), np.zeros(100), np.arange(100.0)])
    got = _stats(x).summary()
    assert got["std"][0] == 0 and got["std"][1] == 0 and got["mean"][0] == 0.25
    assert got["q01"][0] == got["q99"][0] == 0.25 and got["q50"][1] == 0.0  # clamped to [min, max], zero exact


@given(x=arrays, cuts=st.lists(st.integers(0, 80), max_size=6), seed=st.integers(0, 1000))
@settings(deadline=None)
def test_merged_parts_are_bit_identical_to_one_pass_in_any_order(x, cuts, seed):
    whole = _stats(x)
    bounds = sorted({0, len(x), *[c for c in cuts if c <= len(x)]})
    parts = [_stats(x[a:b]) if b > a else ArrayStats(x.shape[1:]) for a, b in zip(bounds, bounds[1:])]
    rnd = random.Random(seed)
    while len(parts) > 1:  # merge random pairs: a random tree in a random order
        i, j = rnd.sample(range(len(parts)), 2)
        merged = parts[i].merge(parts[j])
        parts = [p for k, p in enumerate(parts) if k not in (i, j)] + [merged]
    assert parts[0] == whole
    assert json.dumps(parts[0].to_json(), sort_keys=True) == json.dumps(whole.to_json(), sort_keys=True)


def test_signed_zeros_do_not_make_min_and_max_depend_on_merge_order():
    a, b = _stats(np.array([[-0.0], [1.0]])), _stats(np.array([[0.0], [2.0]]))
    assert a.merge(b) == b.merge(a) == _stats(np.array([[0.0], [-0.0], [1.0], [2.0]]))
    assert json.dumps(a.merge(b).to_json()) == json.dumps(b.merge(a).to_json())


def test_json_round_trips_exactly_and_is_plain_json():
    rng = np.random.default_rng(2)
    s = _stats(rng.normal(0.1, 3, (500, 3)))
    text = json.dumps(s.to_json(), sort_keys=True, allow_nan=False)
    back = ArrayStats.from_json(json.loads(text), where="index.json")
    assert back == s
    for k, v in s.summary().items():
        assert np.array_equal(v, back.summary()[k]), k
    empty = ArrayStats((2,))
    assert ArrayStats.from_json(json.loads(json.dumps(empty.to_json())), where="x") == empty


def test_stats_read_from_json_merge_and_update_as_the_originals():
    """The sketches read back are checked all at once and built lazily; every use sees the same buckets."""
    rng = np.random.default_rng(5)
    a, b = _stats(rng.normal(0, 2, (300, 4))), _stats(rng.normal(5, 1, (200, 4)))  # keys fall across elements
    back_a, back_b = (ArrayStats.from_json(json.loads(json.dumps(s.to_json())), where="x") for s in (a, b))
    assert back_a.merge(back_b) == a.merge(b) and back_b.merge(a) == b.merge(a)
    back_a.update(back_b)
    assert back_a == a.merge(b)
    assert np.array_equal(ArrayStats.from_json(b.to_json(), where="x").quantile(0.9), b.quantile(0.9))


def _good():
    return _stats(np.array([[1.0, -2.0], [3.0, 0.5], [0.0, 7.0]])).to_json()


def _mutate(path, value):
    obj = _good()
    *head, last = path
    tgt = obj
    for p in head:
        tgt = tgt[p]
    if value is KeyError:
        del tgt[last]
    else:
        tgt[last] = value
    return obj


@pytest.mark.parametrize(("obj", "match"), [
    ("stats", "should be an object with keys"),
    (_mutate(["count"], KeyError), "should be an object with keys"),
    (_mutate(["shape"], [2, 0]), r"shape=\[2, 0\]"),
    (_mutate(["shape"], [70000]), "at most 65536 elements"),
    (_mutate(["shape"], "2"), "shape='2'"),
    (_mutate(["count"], -1), "count=-1"),
    (_mutate(["count"], 3.0), "count=3.0"),
    (_mutate(["sub_bits"], 6), "sub_bits=6 should be 7"),
    (_mutate(["sub_bits"], 7.0), "sub_bits=7.0 should be 7"),
    (_mutate(["sum"], ["0x1"]), "sum should be a list of 2 hex strings"),
    (_mutate(["sum", 0], "12"), "sum should be a list of 2 hex strings"),
    (_mutate(["sumsq", 0], "0x" + "f" * 701), "sumsq should be a list of 2 hex strings"),
    (_mutate(["min"], [1.0, "x"]), "min should be a list of 2 finite floats"),
    (_mutate(["max", 1], float("inf")), "max should be a list of 2 finite floats"),
    (_mutate(["sketch"], []), "sketch should be a list of 2"),
    (_mutate(["sketch", 0, 1], [1, 1, 0]), r"sketch\[0\] should be \[increasing bucket keys"),
    (_mutate(["sketch", 0, 0], [5, 4, 3]), r"sketch\[0\] should be"),
    (_mutate(["sketch", 1, 1], [1, 1, 2]), r"summing to count=3"),
    (_mutate(["sketch", 1, 0], [1, 2, 10**9]), r"sketch\[1\] should be"),
    (_mutate(["sketch", 1, 0], [1, 2, 2**70]), r"sketch\[1\] should be"),
    (_mutate(["sketch", 1, 1], [True, 1, 1]), r"sketch\[1\] should be"),
    (_mutate(["sketch", 0, 0], [1.0, 2, 3]), r"sketch\[0\] should be"),
    (_mutate(["sketch", 1], [[1, 2, 3], [1, 1, 1], []]), r"sketch\[1\] should be"),
    (_mutate(["sketch", 0, 1], ["1", 1, 1]), r"sketch\[0\] should be"),
    (_mutate(["sumsq", 0], "0x0"), "element 0 has inconsistent sum, sumsq"),
    (_mutate(["min", 1], 99.0), "element 1 has inconsistent"),
])
def test_hostile_stats_are_refused_by_name(obj, match):
    with pytest.raises(ValueError, match=match):
        ArrayStats.from_json(copy.deepcopy(obj), where="index.json: stats['train']['action']")


@pytest.mark.parametrize(("values", "match"), [
    (np.array([[1.0, np.nan]]), "NaN or infinite"),
    (np.array([[1.0, 2.0, 3.0]]), r"shape \(1, 3\) should be numbers of shape \(steps, 2\)"),
    (np.array([["a", "b"]]), "should be numbers"),
    (np.array([[2**60, 1]], np.int64), "beyond 2\\*\\*53"),
])
def test_bad_values_are_refused_naming_where_they_came_from(values, match):
    with pytest.raises(ValueError, match=f"episode e7 'action'.*{match}"):
        StatsTable({("train", "action"): ArrayStats((2,))}).add("train", "action", values, where="episode e7")


def test_a_table_keeps_splits_and_keys_apart_and_merges_per_job_outputs():
    rng = np.random.default_rng(3)
    eps = [(split, rng.normal(i, 1, (40, 2))) for i, split in enumerate(["train", "val", "train", "train", "val"])]
    one, job_a, job_b = StatsTable(), StatsTable(), StatsTable()
    for i, (split, a) in enumerate(eps):
        for t in (one, job_a if i % 2 else job_b):
            t.add(split, "action", a)
            t.add(split, "state", a[:, :1] * 2)
    assert job_a.merge(job_b) == one == job_b.merge(job_a)
    train = np.concatenate([a for s, a in eps if s == "train"])
    np.testing.assert_allclose(one.get("action", split="train").summary()["mean"], train.mean(0), atol=1e-14)
    back = StatsTable.from_json(json.loads(json.dumps(one.to_json(), sort_keys=True)), where="index.json")
    assert back == one and sorted(one.to_json()) == ["train", "val"]
    with pytest.raises(KeyError, match="no statistics for key 'gripper' in split 'train'; have"):
        one.get("gripper", split="train")
    with pytest.raises(ValueError, match=r"index.json: stats\['train'\]\['action'\]: should be an object"):
        StatsTable.from_json({"train": {"action": 3}}, where="index.json")
