"""`Sorted`: ``np.searchsorted`` over one column of a mapped table without copying the column.

The episodes and segments tables are row-major (``(episodes, 7)`` and ``(segments, 3)``), so a column of them is a
strided view, and ``np.searchsorted`` copies a strided (or differently typed) array whole before searching it: 8
bytes times the episodes on every frame lookup, 35 ms at 10**6 episodes. `Sorted` keeps a contiguous sample of every
`STEP`-th value (made on first use: 1/`STEP` of the column) and searches it, then the one window of at most `STEP`
values between two samples (copied: 8 KB), or for values spread over many windows a binary search of all of them at
once that reads ``log2(STEP)`` values each: what a lookup reads and allocates does not grow with the column. A
contiguous column of the right dtype is searched directly.
"""

from __future__ import annotations

import numpy as np

STEP = 1024  # values between two samples: a window searched per lookup
_FEW = 16  # windows searched one by one (a copy of each); more are searched together, log2(STEP) reads per value


class Sorted:
    """A non-decreasing column (checked at open by the caller) searched as ``np.searchsorted`` would."""

    def __init__(self, col: np.ndarray) -> None:
        self.col = col
        self._direct = col.flags.c_contiguous
        self._sample: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.col)

    def search(self, values: np.ndarray | int, side: str = "left") -> np.ndarray:
        """``np.searchsorted(col, values, side)`` for an array (or one int) of ``values``, reading
        O(log) values of the column per value."""
        col = self.col
        v = np.asarray(values)
        if v.dtype != col.dtype:  # a mixed-type search would convert (copy) the whole column
            v = np.clip(v, 0, None).astype(col.dtype) if v.dtype.kind in "iu" else v.astype(col.dtype)
        if self._direct:
            return np.searchsorted(col, v, side=side).astype(np.int64)
        if self._sample is None:
            self._sample = np.ascontiguousarray(col[::STEP])
        s = np.searchsorted(self._sample, v, side=side).astype(np.int64)
        lo = np.maximum(s - 1, 0) * STEP + (s > 0)  # col[(s - 1) * STEP] is on the left side already
        hi = np.minimum(s * STEP, len(col))
        lo = np.minimum(lo, hi)
        wins = np.unique(s)
        if len(wins) <= _FEW:  # a lookup's few windows: copy each (at most STEP values) and search it
            out = lo.copy()
            for w in wins.tolist():
                sel = s == w
                a, b = int(lo[sel][0]), int(hi[sel][0])
                if a < b:
                    out[sel] = a + np.searchsorted(np.ascontiguousarray(col[a:b]), v[sel], side=side)
            return out
        while True:  # the window's binary search, every value at once
            open_ = lo < hi
            if not open_.any():
                return lo
            mid = (lo + hi) // 2
            at = col[np.where(open_, mid, 0)] if len(col) else mid
            right = (at <= v) if side == "right" else (at < v)
            go = open_ & right
            lo = np.where(go, mid + 1, lo)
            hi = np.where(open_ & ~right, mid, hi)
