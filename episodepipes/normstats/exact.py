"""Per-array, per-dimension statistics (count, mean, std, min, max, quantiles) that merge exactly.

Every accumulator field is an integer or an exact min/max, so merging is associative and commutative
bit for bit: stats merged from per-job (or per-episode) parts equal a single pass, byte for byte once
serialised, in any order.

- Mean and std come from exact sums: every float64 is an integer multiple of ``2**-1127`` (and its
  square of ``2**-2254``), so ``sum(x)`` and ``sum(x*x)`` are kept as Python ints, computed with
  numpy in 18-bit limbs that float64 adds exactly. The mean is then correctly rounded and the
  (population, ``ddof=0``) variance is rounded once; no Welford drift.
- Quantiles come from a log-linear histogram with fixed bucket edges: a value's bucket is its binary
  exponent and the top ``SUB_BITS`` bits of its mantissa (``np.frexp``, exact, platform-independent),
  its sign, or exact zero. The estimate for the ``q`` quantile is its bucket's midpoint, clamped to
  ``[min, max]``: within ``REL_ERROR`` (relative) of ``np.quantile(x, q, method="lower")``.

Values must be finite; integers above ``2**53`` (not exact in float64) are refused.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

import numpy as np

SUB_BITS = 7
REL_ERROR = 2.0 ** -(SUB_BITS + 1)
QUANTILES = {"q01": 0.01, "q10": 0.10, "q50": 0.50, "q90": 0.90, "q99": 0.99}
_SHIFT = 1127  # sum(x) is an integer count of 2**-_SHIFT: frexp mantissas have 53 bits, exponents reach -1073
_EMIN, _EMAX = -1073, 1024  # np.frexp exponents of finite float64
_NE = _EMAX - _EMIN + 1
_KEY_OFF = 1100  # keeps every non-zero key positive before the sign is applied
_KMAX = (_EMAX + _KEY_OFF + 1) << SUB_BITS
_ROWS = 1 << 15  # rows per exact-sum chunk: a bin's float64 total stays below 2**53
_HEX = re.compile(r"-?0x[0-9a-f]{1,700}")
_FIELDS = {"shape", "count", "sum", "sumsq", "min", "max", "sketch", "sub_bits"}
MAX_DIMS = 1 << 16
KEY_LIMIT = _KMAX  # every bucket key k has -KEY_LIMIT < k < KEY_LIMIT
Packed = tuple[np.ndarray, np.ndarray, np.ndarray]  # keys, counts (int64, back to back) and each element's end


def _keys(x: np.ndarray) -> np.ndarray:
    """Each value's signed bucket key (0 for exact zero); monotone in the value."""
    m, e = np.frexp(np.abs(x))
    sub = np.floor((m - 0.5) * (1 << (SUB_BITS + 1))).astype(np.int64)  # m - 0.5 is exact (Sterbenz)
    key = ((e.astype(np.int64) + _KEY_OFF) << SUB_BITS) + sub
    return np.where(x == 0, 0, np.where(x < 0, -key, key))


def _value(key: int) -> float:
    """The midpoint of a key's bucket (relative error at most REL_ERROR for any value in it)."""
    if key == 0:
        return 0.0
    k = abs(key)
    e, sub = (k >> SUB_BITS) - _KEY_OFF, k & ((1 << SUB_BITS) - 1)
    return math.copysign(math.ldexp(0.5 + (sub + 0.5) / (1 << (SUB_BITS + 1)), e), key)


def _values(keys: np.ndarray) -> np.ndarray:
    """`_value` of many keys at once, with the same float64 operations (so the same bits)."""
    k = np.abs(keys)
    e, sub = (k >> SUB_BITS) - _KEY_OFF, k & ((1 << SUB_BITS) - 1)
    out = np.copysign(np.ldexp(0.5 + (sub + 0.5) / (1 << (SUB_BITS + 1)), e.astype(np.int32)), keys)
    return np.where(keys == 0, 0.0, out)


def _exact_sums(x: np.ndarray) -> tuple[list[int], list[int]]:
    """Per column of ``x`` (at most ``_ROWS`` rows): ``sum(x) * 2**_SHIFT`` and ``sum(x*x) * 2**(2*_SHIFT)``."""
    t, d = x.shape
    m, e = np.frexp(x)
    mi = (m * 2.0**53).astype(np.int64)  # x == mi * 2**(e - 53), exactly
    a, b, c = mi >> 36, (mi >> 18) & 0x3FFFF, mi & 0x3FFFF  # mi == a*2**36 + b*2**18 + c
    # only the (column, exponent) bins that occur: a few per column, where every exponent would be 2098
    used, bins = np.unique(((e.astype(np.int64) - _EMIN) + np.arange(d, dtype=np.int64) * _NE).ravel(),
                           return_inverse=True)
    bins = bins.ravel()

    def total(v: np.ndarray) -> np.ndarray:  # exact: |v| < 2**38 and at most 2**15 of them per bin
        return np.bincount(bins, weights=v.ravel().astype(np.float64), minlength=len(used))

    limbs = np.array([total(v) for v in (a, b, c, a * a, 2 * a * b, 2 * a * c + b * b, 2 * b * c, c * c)])
    sums, squares = [0] * d, [0] * d
    for i, sa, sb, sc, qaa, qab, qm, qbc, qcc in zip(used.tolist(), *limbs.astype(np.int64).tolist()):
        col, ex = divmod(i, _NE)
        ex += _EMIN
        sums[col] += ((sa << 36) + (sb << 18) + sc) << (ex - 53 + _SHIFT)
        squares[col] += ((qaa << 72) + (qab << 54) + (qm << 36) + (qbc << 18) + qcc) << (2 * (ex - 53 + _SHIFT))
    return sums, squares


def _merge_packed(parts: list[Packed], d: int) -> Packed:
    """The packed sketch of ``d`` elements holding every part's counts: one sort over all parts' (element, key)
    pairs, counts summed as int64 (exact), so any grouping of the same parts gives the same arrays."""
    parts = [p for p in parts if len(p[0])]
    if len(parts) == 1:
        return parts[0]
    if not parts:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(d, np.int64)
    span, base = 2 * _KMAX + 1, np.arange(d, dtype=np.int64) * (2 * _KMAX + 1) + _KMAX
    runs = np.diff(np.stack([e for _, _, e in parts]), axis=1, prepend=0).ravel()  # every part has d elements
    flat = np.concatenate([k for k, _, _ in parts]) + np.repeat(np.tile(base, len(parts)), runs)
    order = np.argsort(flat, kind="stable")  # the parts are sorted runs, which a stable sort merges
    flat = flat[order]
    starts = np.flatnonzero(np.concatenate([[True], flat[1:] != flat[:-1]]))
    counts = np.add.reduceat(np.concatenate([c for _, c, _ in parts])[order], starts)
    cols, keys = np.divmod(flat[starts], span)
    return keys - _KMAX, counts.astype(np.int64), np.searchsorted(cols, np.arange(1, d + 1)).astype(np.int64)


def _column_sketch(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every column's bucket keys and counts of ``x`` (steps, d), back to back, and where each column's run ends."""
    d = x.shape[1]
    flat = (_keys(x) + _KMAX + np.arange(d, dtype=np.int64) * (2 * _KMAX + 1)).ravel()
    uniq, counts = np.unique(flat, return_counts=True)  # sorted: by column, then by key
    cols, keys = np.divmod(uniq, 2 * _KMAX + 1)
    return keys - _KMAX, counts.astype(np.int64), np.searchsorted(cols, np.arange(1, d + 1)).astype(np.int64)


def _column_sums(x: np.ndarray) -> tuple[list[int], list[int]]:
    """`_exact_sums` of every column of ``x``, over any number of rows."""
    sums, squares = [0] * x.shape[1], [0] * x.shape[1]
    for r in range(0, len(x), _ROWS):
        s, q = _exact_sums(x[r:r + _ROWS])
        sums = [a + b for a, b in zip(sums, s)]
        squares = [a + b for a, b in zip(squares, q)]
    return sums, squares


def _not_finite(where: str) -> str:
    return f"{where}: has NaN or infinite values; fix or drop them before writing"


def add_fresh(items: list[tuple[ArrayStats, Any, str]]) -> list[str | None]:
    """`ArrayStats.add` of each ``(accumulator, values, where)`` into its fresh accumulator, the values of equal
    step counts in one pass over all their columns side by side (a column's sums, min/max and buckets do not
    depend on its neighbours, so each result is its own `add`'s, bit for bit). Returns, per item, the error
    `add` would raise (that accumulator left unchanged), or None."""
    errors: list[str | None] = [None] * len(items)
    by_steps: dict[int, list[tuple[int, np.ndarray]]] = {}
    for i, (acc, values, where) in enumerate(items):
        if acc.count or acc._packed is not None or acc._parts or any(acc._sketch):
            raise ValueError(f"{where}: add_fresh takes fresh accumulators only")
        try:
            arr = acc._checked(values, where)
        except ValueError as e:
            errors[i] = str(e)
        else:
            by_steps.setdefault(len(arr), []).append((i, arr))
    for steps, group in by_steps.items():
        if not steps:
            continue
        widths = [a.shape[1] for _, a in group]
        x = np.empty((steps, sum(widths)))
        at = np.cumsum([0, *widths]).tolist()
        for (_, a), lo, hi in zip(group, at, at[1:]):
            x[:, lo:hi] = a
        x += 0.0  # -0.0 -> 0.0, as `add` does
        finite = np.isfinite(x).all(0).tolist()
        refused = [not all(finite[lo:hi]) for lo, hi in zip(at, at[1:])]
        if any(refused):
            for (i, _), bad in zip(group, refused):
                if bad:
                    errors[i] = _not_finite(items[i][2])
            cols = [c for (lo, hi), bad in zip(zip(at, at[1:]), refused) if not bad for c in range(lo, hi)]
            group = [g for g, bad in zip(group, refused) if not bad]
            widths = [w for w, bad in zip(widths, refused) if not bad]
            x, at = x[:, cols], np.cumsum([0, *widths]).tolist()
        if not group:
            continue
        lows, highs = x.min(0), x.max(0)
        sums, squares = _column_sums(x)
        keys, counts, ends = _column_sketch(x)
        for (i, _), lo, hi in zip(group, at, at[1:]):
            acc, k0 = items[i][0], int(ends[lo - 1]) if lo else 0
            acc.count, acc._min, acc._max = steps, lows[lo:hi], highs[lo:hi]
            acc._sum, acc._sq = sums[lo:hi], squares[lo:hi]
            k1 = int(ends[hi - 1]) if hi > lo else k0
            acc._sketch_dicts, acc._packed = None, (keys[k0:k1], counts[k0:k1], ends[lo:hi] - k0)
    return errors


class ArrayStats:
    """The mergeable statistics of one array key (per step shape ``shape``) in one split.

    Attributes:
        shape: the per-step shape; statistics are per element of it.
        count: steps seen.
    """

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.shape = tuple(int(s) for s in shape)
        d = math.prod(self.shape)
        self.count = 0
        self._sum, self._sq = [0] * d, [0] * d
        self._min, self._max = np.full(d, np.inf), np.full(d, -np.inf)
        self._sketch_dicts: list[dict[int, int]] | None = [{} for _ in range(d)]
        self._sketch_lists: list | None = None  # checked [keys, counts] pairs from JSON, made dicts on first use
        self._packed: Packed | None = None  # from a stats file or one add to a fresh accumulator; dicts on demand
        self._parts: list[Packed] = []  # packed sketches added since, merged in one pass when the sketch is read

    @property
    def _sketch(self) -> list[dict[int, int]]:
        """Per element, bucket key -> count. An index opened only to serve summaries never needs the dicts of
        every element, so those read from JSON or a stats file are built when first used."""
        if self._parts:
            self._settle()
        if self._sketch_dicts is None:
            if self._packed is not None:
                keys, counts, ends = (a.tolist() for a in self._packed)
                self._sketch_dicts = [dict(zip(keys[a:b], counts[a:b])) for a, b in zip([0, *ends], ends)]
            else:
                self._sketch_dicts = [dict(zip(*b)) for b in self._sketch_lists or ()]
            self._sketch_lists = self._packed = None
        return self._sketch_dicts

    @_sketch.setter
    def _sketch(self, value: list[dict[int, int]]) -> None:
        self._sketch_dicts, self._sketch_lists, self._packed, self._parts = value, None, None, []

    def _settle(self) -> None:
        """Merge the parts added since the sketch was last read into it, as one packed sketch."""
        parts, self._parts = self._parts, []
        merged = _merge_packed([self.packed(), *parts], len(self._sum))
        self._sketch_dicts, self._sketch_lists, self._packed = None, None, merged

    def packed(self) -> Packed:
        """The sketch as arrays: every element's increasing keys and their counts back to back (int64), and
        where each element's run ends; what a stats file stores."""
        if self._parts:
            self._settle()
        if self._packed is not None:
            return self._packed
        keys, counts, ends, n = [], [], [], 0
        for sk in self._sketch:
            k = np.fromiter(sk.keys(), np.int64, len(sk))
            c = np.fromiter(sk.values(), np.int64, len(sk))
            order = np.argsort(k, kind="stable")
            keys.append(k[order])
            counts.append(c[order])
            n += len(sk)
            ends.append(n)
        if not keys:
            return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.concatenate(keys), np.concatenate(counts), np.array(ends, np.int64)

    def moments(self) -> tuple[list[int], list[int], np.ndarray, np.ndarray]:
        """(exact sums, exact sums of squares, min, max) per element, as `from_arrays` takes them back (what a
        stats file stores besides the sketch); treat them as read-only."""
        return self._sum, self._sq, self._min, self._max

    @classmethod
    def from_arrays(cls, shape: tuple[int, ...], count: int, sums: list[int], squares: list[int], lo: np.ndarray,
                    hi: np.ndarray, sketch: Packed, *, where: str) -> ArrayStats:
        """An accumulator from a stats file's fields, each already checked by type, range and length; the
        sums are checked here against each other and min/max."""
        out = cls(shape)
        out.count, out._sum, out._sq = count, list(sums), list(squares)
        if count:
            out._min, out._max = np.array(lo, np.float64), np.array(hi, np.float64)
        out._sketch_dicts, out._packed = None, sketch
        _check_sums(out, where)
        return out

    def add(self, values: Any, *, where: str = "values") -> None:
        """Add ``values`` of shape ``(steps, *shape)``; ``where`` names them in errors (episode and key)."""
        x = self._checked(values, where).astype(np.float64) + 0.0  # -0.0 -> 0.0: min/max then ignore merge order
        if not np.isfinite(x).all():
            raise ValueError(_not_finite(where))
        if len(x):
            self._add_rows(x)

    def _checked(self, values: Any, where: str) -> np.ndarray:
        """``values`` as an array of ``(steps, elements)``, refused by name unless numbers of this step shape that
        float64 holds exactly (finiteness is the caller's check, once its values are float64)."""
        arr = np.asarray(values)
        if arr.ndim != len(self.shape) + 1 or arr.shape[1:] != self.shape or arr.dtype.kind not in "iuf":
            raise ValueError(f"{where}: {arr.dtype} array of shape {arr.shape} should be numbers of shape "
                             f"(steps, {', '.join(map(str, self.shape))})")
        if arr.dtype.kind in "iu" and arr.size and max(abs(int(arr.min())), abs(int(arr.max()))) > 2**53:
            raise ValueError(f"{where}: integers beyond 2**53 are not exact as float64; store them as float64")
        return arr.reshape(len(arr), -1)

    def _add_rows(self, x: np.ndarray) -> None:
        """Add the rows of ``x`` (float64, finite, no -0.0, at least one row)."""
        fresh = self.count == 0 and self._sketch_dicts is not None and not self._parts and not any(self._sketch_dicts)
        self.count += len(x)
        self._min, self._max = np.minimum(self._min, x.min(0)), np.maximum(self._max, x.max(0))
        sums, squares = _column_sums(x)
        self._sum = [a + b for a, b in zip(self._sum, sums)]
        self._sq = [a + b for a, b in zip(self._sq, squares)]
        part = _column_sketch(x)
        if fresh:  # one episode's accumulator: its sketch is these arrays, made dicts only if it is updated
            self._sketch_dicts, self._packed = None, part
        else:
            self._parts.append(part)

    def merge(self, other: ArrayStats) -> ArrayStats:
        """A new accumulator holding both; exact, so any merge order gives the same result."""
        if other.shape != self.shape:
            raise ValueError(f"cannot merge statistics of shape {self.shape} with {other.shape}")
        out = ArrayStats(self.shape)
        out.count = self.count + other.count
        out._sum = [a + b for a, b in zip(self._sum, other._sum)]
        out._sq = [a + b for a, b in zip(self._sq, other._sq)]
        out._min, out._max = np.minimum(self._min, other._min), np.maximum(self._max, other._max)
        out._sketch = [{k: a.get(k, 0) + b.get(k, 0) for k in a.keys() | b.keys()}
                       for a, b in zip(self._sketch, other._sketch)]
        return out

    def update(self, other: ArrayStats) -> None:
        """Merge ``other`` into this accumulator in place, in time proportional to ``other`` (the writer
        folds each small per-episode part into a large total); the result equals `merge`'s."""
        if other.shape != self.shape:
            raise ValueError(f"cannot merge statistics of shape {self.shape} with {other.shape}")
        self.count += other.count
        self._sum = [a + b for a, b in zip(self._sum, other._sum)]
        self._sq = [a + b for a, b in zip(self._sq, other._sq)]
        self._min, self._max = np.minimum(self._min, other._min), np.maximum(self._max, other._max)
        if other.count:
            self._parts.append(other.packed())  # merged with the others when the sketch is next read

    def quantile(self, q: float) -> np.ndarray:
        """The ``q`` quantile per element (float64, of ``shape``), within ``REL_ERROR`` of numpy's "lower"."""
        if not 0 <= q <= 1 or not self.count:
            raise ValueError(f"{q=} should be in [0, 1], over at least one step (count={self.count})")
        if self._parts:
            self._settle()
        rank = int(np.floor(q * (self.count - 1)))  # numpy's "lower" virtual index, computed as numpy does
        if self._packed is not None:  # every element at once: the first key whose running count passes rank
            keys, counts, ends = self._packed
            cum = np.cumsum(counts)
            base = np.concatenate([[0], cum[ends[:-1] - 1]]) if len(ends) else np.zeros(0, np.int64)
            at = keys[np.searchsorted(cum, base + rank, side="right")]
            return np.clip(_values(at), self._min, self._max).reshape(self.shape)
        out = np.empty(len(self._sketch))
        for i, sk in enumerate(self._sketch):
            keys = sorted(sk)
            cum = np.cumsum([sk[k] for k in keys])
            out[i] = _value(keys[int(np.searchsorted(cum, rank, side="right"))])
        return np.clip(out, self._min, self._max).reshape(self.shape)

    def summary(self) -> dict[str, Any]:
        """``count`` and float64 arrays of ``shape``: mean, std (ddof=0), min, max, q01, q10, q50, q90, q99."""
        if not self.count:
            raise ValueError("no steps were added, so there are no statistics; check the split and key")
        n = self.count
        mean = [float(Fraction(s, n << _SHIFT)) for s in self._sum]
        var = [float(Fraction(n * q - s * s, (n * n) << (2 * _SHIFT))) for s, q in zip(self._sum, self._sq)]
        out: dict[str, Any] = {"count": n, "mean": np.array(mean).reshape(self.shape),
                               "std": np.sqrt(np.array(var)).reshape(self.shape),
                               "min": self._min.reshape(self.shape).copy(), "max": self._max.reshape(self.shape).copy()}
        out.update((name, self.quantile(q)) for name, q in QUANTILES.items())
        return out

    def to_json(self) -> dict[str, Any]:
        """Plain JSON types, deterministic (exact ints as hex strings; min/max floats round-trip by repr)."""
        seen = self.count > 0
        return {"shape": list(self.shape), "count": self.count, "sub_bits": SUB_BITS,
                "sum": [hex(s) for s in self._sum], "sumsq": [hex(s) for s in self._sq],
                "min": self._min.tolist() if seen else None, "max": self._max.tolist() if seen else None,
                "sketch": [[sorted(sk), [sk[k] for k in sorted(sk)]] for sk in self._sketch]}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ArrayStats) and self.to_json() == other.to_json()

    @classmethod
    def from_json(cls, obj: Any, *, where: str) -> ArrayStats:
        """Read `to_json` output back, refusing any field of the wrong type, shape or value by name.

        Args:
            obj: the parsed JSON object.
            where: names the file and entry in errors.
        """
        if not isinstance(obj, dict) or set(obj) != _FIELDS:
            raise ValueError(f"{where}: should be an object with keys {sorted(_FIELDS)}, got "
                             f"{sorted(obj) if isinstance(obj, dict) else type(obj).__name__}")
        shape, count = obj["shape"], obj["count"]
        if (not isinstance(shape, list) or len(shape) > 8 or not all(_is_int(s) and s > 0 for s in shape)
                or math.prod(shape) > MAX_DIMS):
            raise ValueError(f"{where}: shape={shape!r} should be a list of at most 8 positive ints, "
                             f"at most {MAX_DIMS} elements")
        if not _is_int(count) or not 0 <= count < 2**62 or not _is_int(obj["sub_bits"]) or obj["sub_bits"] != SUB_BITS:
            raise ValueError(f"{where}: count={count!r} should be a non-negative int and sub_bits="
                             f"{obj['sub_bits']!r} should be {SUB_BITS}")
        out = cls(tuple(shape))
        d = len(out._sum)
        out.count = count
        out._sum, out._sq = (_hexes(obj[k], d, f"{where}: {k}") for k in ("sum", "sumsq"))
        if count:
            out._min, out._max = (_floats(obj[k], d, f"{where}: {k}") for k in ("min", "max"))
        elif obj["min"] is not None or obj["max"] is not None:
            raise ValueError(f"{where}: min and max should be null when count is 0")
        sketch = obj["sketch"]
        if not isinstance(sketch, list) or len(sketch) != d:
            raise ValueError(f"{where}: sketch should be a list of {d} [keys, counts] pairs")
        if _sketch_ok(sketch, count):
            out._sketch_dicts, out._sketch_lists = None, sketch
        else:  # find the entry to name
            out._sketch = [_bucket(b, count, f"{where}: sketch[{i}]") for i, b in enumerate(sketch)]
        _check_sums(out, where)
        return out


def _check_sums(out: ArrayStats, where: str) -> None:
    count = out.count
    for i in range(len(out._sum)):
        s, q = out._sum[i], out._sq[i]
        if q < 0 or count * q < s * s or (count and not out._min[i] <= out._max[i]) or (not count and (s or q)):
            raise ValueError(f"{where}: element {i} has inconsistent sum, sumsq, min and max; "
                             "recompute the statistics (episodepipes-shard stats --recompute)")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _only(v: list, kind: type) -> bool:
    """Every item of ``v`` is exactly ``kind`` (a bool is no int here); one C-level pass, no per-item Python."""
    return set(map(type, v)) <= {kind}


def _hexes(v: Any, d: int, where: str) -> list[int]:
    if not isinstance(v, list) or len(v) != d or not _only(v, str) or not all(map(_HEX.fullmatch, v)):
        raise ValueError(f"{where} should be a list of {d} hex strings like '0x1f' or '-0x1f'")
    return [int(s, 16) for s in v]


def _floats(v: Any, d: int, where: str) -> np.ndarray:
    out = np.array(v, np.float64) if isinstance(v, list) and len(v) == d and _only(v, float) else None
    if out is None or not np.isfinite(out).all():
        raise ValueError(f"{where} should be a list of {d} finite floats")
    return out


def _sketch_ok(sketch: list, count: int) -> bool:
    """Every entry is what `_bucket` accepts, checked for all elements at once: a wide array has thousands of
    entries, each with hundreds of keys, and per-key Python made this most of an index's open time."""
    if not all(type(b) is list and len(b) == 2 and type(b[0]) is list and type(b[1]) is list
               and len(b[0]) == len(b[1]) for b in sketch):
        return False
    keys = list(itertools.chain.from_iterable(b[0] for b in sketch))
    counts = list(itertools.chain.from_iterable(b[1] for b in sketch))
    if not (_only(keys, int) and _only(counts, int)) or (counts and min(counts) <= 0):
        return False
    if any(sum(b[1]) != count for b in sketch):
        return False
    if not keys:
        return True
    try:
        k = np.array(keys, np.int64)
    except OverflowError:  # beyond int64: far outside the keys' range
        return False
    starts = np.cumsum([len(b[0]) for b in sketch])[:-1]  # where each element's keys begin, after the first's
    up = np.diff(k) > 0
    up[starts[(starts > 0) & (starts < len(k))] - 1] = True  # one element's last key and the next's first: no order
    return bool(up.all()) and -_KMAX < int(k.min()) and int(k.max()) < _KMAX


def _bucket(v: Any, count: int, where: str) -> dict[int, int]:
    ok = isinstance(v, list) and len(v) == 2 and all(isinstance(x, list) for x in v) and len(v[0]) == len(v[1])
    keys, counts = (v if ok else ([], []))
    if (not ok or not all(_is_int(k) and -_KMAX < k < _KMAX for k in keys)
            or any(a >= b for a, b in zip(keys, keys[1:]))
            or not all(_is_int(n) and n > 0 for n in counts) or sum(counts) != count):
        raise ValueError(f"{where} should be [increasing bucket keys, positive counts summing to count={count}]")
    return dict(zip(keys, counts))


class StatsTable:
    """One `ArrayStats` per (split, key): what the writer accumulates and the index stores."""

    def __init__(self, stats: Mapping[tuple[str, str], ArrayStats] | None = None) -> None:
        self._by: dict[tuple[str, str], ArrayStats] = dict(stats or {})

    def add(self, split: str, key: str, values: Any, *, where: str = "values") -> None:
        """Accumulate one episode's ``values`` of ``key`` (shape ``(steps, *step shape)``) into ``split``."""
        arr = np.asarray(values)
        acc = self._by.setdefault((split, key), ArrayStats(arr.shape[1:]))
        acc.add(arr, where=f"{where} {key!r}")

    def merge(self, other: StatsTable) -> StatsTable:
        """Both tables' statistics, merged per (split, key)."""
        out = dict(self._by)
        for k, v in other._by.items():
            out[k] = out[k].merge(v) if k in out else v
        return StatsTable(out)

    def keys(self) -> list[tuple[str, str]]:
        """Every (split, key) with statistics, sorted."""
        return sorted(self._by)

    def get(self, key: str, *, split: str) -> ArrayStats:
        if (split, key) not in self._by:
            raise KeyError(f"no statistics for key {key!r} in split {split!r}; have "
                           f"{sorted(f'{s}/{k}' for s, k in self._by)}")
        return self._by[(split, key)]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StatsTable) and self.to_json() == other.to_json()

    def to_json(self) -> dict[str, dict[str, Any]]:
        """``{split: {key: ArrayStats.to_json()}}``."""
        out: dict[str, dict[str, Any]] = {}
        for (split, key), v in sorted(self._by.items()):
            out.setdefault(split, {})[key] = v.to_json()
        return out

    @classmethod
    def from_json(cls, obj: Any, *, where: str) -> StatsTable:
        """Read `to_json` output; ``where`` names the file in errors."""
        if not isinstance(obj, dict):
            raise ValueError(f"{where}: stats should be an object of splits, got {type(obj).__name__}")
        by = {}
        for split, keys in obj.items():
            if not isinstance(keys, dict):
                raise ValueError(f"{where}: stats[{split!r}] should be an object of array keys")
            for key, v in keys.items():
                by[(split, key)] = ArrayStats.from_json(v, where=f"{where}: stats[{split!r}][{key!r}]")
        return cls(by)
