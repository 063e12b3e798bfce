"""`ArrayStats` (numpy, limbs, packed episode sketches) against a plain Python reference on random data:
the same sums, min/max and bucket counts bit for bit, for every dtype it takes, added whole or folded from
episode parts; and NaN, infinities and inexact integers refused alike for every dtype that can hold them."""

from __future__ import annotations

import math
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest

from episodepipes.normstats import ArrayStats, add_fresh

SHIFT, SUB_BITS, KEY_OFF = 1127, 7, 1100  # the module's documented scales, restated for the reference
DTYPES = ["float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]


def _key(v: float) -> int:
    if v == 0:
        return 0
    m, e = math.frexp(abs(v))
    key = ((e + KEY_OFF) << SUB_BITS) + math.floor((m - 0.5) * (1 << (SUB_BITS + 1)))
    return -key if v < 0 else key


def reference(x: np.ndarray) -> dict:
    """What `ArrayStats.to_json` should hold for ``x`` of shape (steps, d), value by value in Python."""
    cols = [[float(v) + 0.0 for v in x[:, j].tolist()] for j in range(x.shape[1])]
    sums = [sum(map(Fraction, c)) * 2**SHIFT for c in cols]
    squares = [sum(Fraction(v) ** 2 for v in c) * 2 ** (2 * SHIFT) for c in cols]
    assert all(s.denominator == 1 for s in sums + squares)
    sketch = [sorted(Counter(map(_key, c)).items()) for c in cols]
    return {"shape": [x.shape[1]], "count": len(x), "sub_bits": SUB_BITS,
            "sum": [hex(int(s)) for s in sums], "sumsq": [hex(int(s)) for s in squares],
            "min": [min(c) for c in cols], "max": [max(c) for c in cols],
            "sketch": [[[k for k, _ in sk], [n for _, n in sk]] for sk in sketch]}


def _data(rng: np.random.Generator, dtype: str, steps: int, d: int) -> np.ndarray:
    dt = np.dtype(dtype)
    if dt.kind == "f":
        scale = 10.0 ** rng.integers(-3, 4, size=d)
        x = (rng.standard_normal((steps, d)) * scale).astype(dt)
        x[rng.random((steps, d)) < 0.05] = 0  # exact zeros
        x.flat[rng.integers(0, x.size, 3)] = -0.0
        if dt == np.float64:
            x[0, 0], x[-1, -1], x.flat[1] = 5e-324, -1e300, 2.0**-1070  # subnormals and a huge value
        else:
            x[0, 0], x[-1, -1] = np.finfo(dt).tiny / 4, np.finfo(dt).max  # a subnormal and the largest
        return x
    info = np.iinfo(dt)
    lo, hi = max(int(info.min), -(2**53)), min(int(info.max), 2**53)
    x = rng.integers(lo, hi, size=(steps, d), endpoint=True, dtype=dt)
    x[0, 0], x[-1, -1] = lo, hi  # the range's ends, 2**53 included where the dtype holds it
    return x


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_equals_the_python_reference_bit_for_bit(dtype):
    rng = np.random.default_rng(DTYPES.index(dtype))
    x = _data(rng, dtype, 257, 5)
    acc = ArrayStats((5,))
    acc.add(x)
    assert acc.to_json() == reference(x)


@pytest.mark.parametrize("dtype", ["float32", "float64", "int16", "uint64"])
def test_episode_parts_folded_into_a_total_equal_one_add_and_the_reference(dtype):
    rng = np.random.default_rng(7)
    x = _data(rng, dtype, 300, 4)
    cuts = [0, 1, 40, 41, 170, 300]  # a one-step part, and parts with keys the total has and has not seen
    total, repeated = ArrayStats((4,)), ArrayStats((4,))
    for a, b in zip(cuts, cuts[1:]):
        part = ArrayStats((4,))
        part.add(x[a:b])
        total.update(part)
        repeated.add(x[a:b])  # adding again to the same accumulator: the dict path
    whole = ArrayStats((4,))
    whole.add(x)
    want = reference(x)
    assert total.to_json() == repeated.to_json() == whole.to_json() == want
    merged = ArrayStats((4,))
    merged.add(x[:100])
    other = ArrayStats((4,))
    other.add(x[100:])
    assert merged.merge(other).to_json() == want
    for q in (0.0, 0.01, 0.5, 0.99, 1.0):  # packed (one add) and dict (folded) sketches answer alike
        assert np.array_equal(whole.quantile(q), total.quantile(q))
        assert np.array_equal(whole.packed()[0], total.packed()[0])


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_and_infinities_are_refused_and_leave_the_accumulator_unchanged(dtype, bad):
    x = _data(np.random.default_rng(3), dtype, 20, 3)
    acc = ArrayStats((3,))
    acc.add(x)
    before = acc.to_json()
    y = x.copy()
    y[5, 1] = bad
    with pytest.raises(ValueError, match="NaN or infinite"):
        acc.add(y, where="episode 'e' 'state'")
    assert acc.to_json() == before


@pytest.mark.parametrize("dtype", ["int64", "uint64"])
def test_integers_beyond_2_53_are_refused(dtype):
    x = np.zeros((4, 2), dtype)
    x[2, 1] = 2**53 + 1
    with pytest.raises(ValueError, match="2\\*\\*53"):
        ArrayStats((2,)).add(x)


def test_more_rows_than_one_exact_sum_chunk_equal_the_reference():
    x = _data(np.random.default_rng(11), "float32", 33_000, 2)  # past 2**15 rows: two chunks of exact sums
    acc = ArrayStats((2,))
    acc.add(x)
    assert acc.to_json() == reference(x)


def test_a_scalar_per_step_key_and_bools_refused():
    x = np.arange(10, dtype=np.int64)
    acc = ArrayStats(())
    acc.add(x)
    assert acc.to_json() == {**reference(x[:, None]), "shape": []}
    with pytest.raises(ValueError, match="should be numbers"):
        ArrayStats(()).add(np.zeros(3, bool))


def test_keys_added_together_equal_one_add_each_and_the_reference():
    """`add_fresh` (an episode's keys in one pass over their columns side by side): every key's statistics are
    its own `add`'s and the reference's bit for bit, whatever its neighbours; a refused key gets `add`'s error
    and the others are unaffected."""
    rng = np.random.default_rng(5)
    good = {"f16": _data(rng, "float16", 40, 3), "f64": _data(rng, "float64", 40, 2),
            "i64": _data(rng, "int64", 40, 1), "u8": _data(rng, "uint8", 40, 4).reshape(40, 2, 2),
            "scalar": _data(rng, "int32", 40, 1)[:, 0], "short": _data(rng, "float32", 7, 2),
            "long": _data(rng, "float32", 33_000, 1)}
    nan = _data(rng, "float32", 40, 2)
    nan[3, 1] = np.nan
    big = np.zeros((40, 1), np.int64)
    big[1, 0] = 2**53 + 1
    bad = {"nan": nan, "inf": np.full((7, 1), -np.inf), "big": big, "bool": np.zeros((40, 2), bool),
           "empty": np.zeros((0, 3), np.float32)}  # numpy's reshape error, as `add` has always given
    values = {**good, **bad}
    accs = {k: ArrayStats(np.asarray(v).shape[1:]) for k, v in values.items()}
    errors = dict(zip(values, add_fresh([(accs[k], v, f"episode 'e' array {k!r}") for k, v in values.items()])))
    for key, v in values.items():
        alone = ArrayStats(np.asarray(v).shape[1:])
        try:
            alone.add(v, where=f"episode 'e' array {key!r}")
        except ValueError as e:
            assert key in bad and errors[key] == str(e)
            assert accs[key].to_json() == alone.to_json()  # left unchanged, as `add` leaves it
            continue
        assert errors[key] is None and accs[key].to_json() == alone.to_json()
        if len(v):
            x = np.asarray(v).reshape(len(v), -1)
            assert accs[key].to_json() == {**reference(x), "shape": list(np.asarray(v).shape[1:])}
        total = ArrayStats(accs[key].shape)  # an episode's part folds like one `add`'s
        total.update(accs[key])
        assert total.to_json() == alone.to_json()
