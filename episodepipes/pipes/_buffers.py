"""Large arrays handed out again only once nothing made from them is alive (no page faults on reuse)."""

from __future__ import annotations

import sys

import numpy as np


class BufferPool:
    """Arrays to decode or stack into, reused once every tensor and view made from them is gone.

    `torch.from_numpy` keeps a reference to its array, and every numpy view keeps one to its base, so
    an array whose reference count is back to the pool's own is free. A fresh large buffer costs a
    page fault per 4 KB on first touch; a reused one does not.
    """

    def __init__(self, keep: int = 8) -> None:
        self.keep = keep
        self._free: dict[tuple, list[np.ndarray]] = {}

    def get(self, shape: tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
        bufs = self._free.setdefault((tuple(shape), np.dtype(dtype).str), [])
        for b in bufs:
            if sys.getrefcount(b) <= 3:  # the list, the loop variable, getrefcount's argument
                return b
        b = np.empty(shape, dtype)
        if len(bufs) < self.keep:
            bufs.append(b)
        return b


def consecutive_rows(arrays: list[np.ndarray]) -> np.ndarray | None:
    """``base[j:j+n]`` when ``arrays`` are rows ``j..j+n-1`` of one contiguous base array, else None.

    That is how `Decoder` lays out a batch's frames, so stacking them is a view, not a copy.
    """
    a0 = arrays[0]
    base = a0.base
    if not isinstance(base, np.ndarray) or not base.flags.c_contiguous or base.shape[1:] != a0.shape:
        return None
    step, start = a0.nbytes, a0.ctypes.data
    offset = start - base.ctypes.data
    if step == 0 or offset % step:
        return None
    for i, a in enumerate(arrays):
        if a.base is not base or a.ctypes.data != start + i * step:
            return None
    j = offset // step
    return base[j:j + len(arrays)]
