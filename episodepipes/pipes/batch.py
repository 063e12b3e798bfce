"""`Collator`: decoded samples into batch dicts of tensors, reusing batch buffers nobody holds any more.

A batch has one uint8 ``[B, 3, H, W]`` tensor per camera and one tensor per array key (both stacked
from the samples' arrays), ``frame`` (int64), ``timestamp`` (float64 seconds), ``valid`` (bool),
``episode`` and ``prompt`` (lists of str).
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import torch
from torchdata.nodes import BaseNode

from episodepipes.pipes.stats import Stats

LISTS = ("episode", "prompt")
SCALARS = {"frame": torch.int64, "timestamp": torch.float64, "valid": torch.bool}


class BufferPool:
    """Arrays to stack into, handed out again only once every tensor made from them is gone.

    `torch.from_numpy` keeps a reference to its array, and so does every view of that tensor, so an
    array whose reference count is back to ours alone is free. A fresh large buffer costs page faults
    on every first touch; a reused one does not.
    """

    def __init__(self) -> None:
        self._free: dict[tuple, list[np.ndarray]] = {}

    def get(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        bufs = self._free.setdefault((shape, np.dtype(dtype).str), [])
        for b in bufs:
            if sys.getrefcount(b) <= 3:  # the list, the loop variable, getrefcount's argument
                return b
        b = np.empty(shape, dtype)
        if len(bufs) < 8:
            bufs.append(b)
        return b


def collate(samples: list[dict], buffers: BufferPool | None = None) -> dict[str, Any]:
    """Stack a list of decoded samples into one batch dict (see the module docstring)."""
    first = samples[0]
    out: dict[str, Any] = {k: [s[k] for s in samples] for k in LISTS}
    for k, dtype in SCALARS.items():
        out[k] = torch.tensor([s[k] for s in samples], dtype=dtype)
    for k, v in first.items():
        if k in out:
            continue
        shape = (len(samples), *np.shape(v))
        arr = np.asarray(v)
        buf = buffers.get(shape, arr.dtype) if buffers is not None else np.empty(shape, arr.dtype)
        for i, s in enumerate(samples):
            buf[i] = s[k]
        out[k] = torch.from_numpy(buf)
    return out


class Collator(BaseNode[dict]):
    """Group ``batch_size`` samples from ``source`` into a batch dict; the last batch may be short.

    ``reuse_buffers=False`` allocates every batch afresh (for consumers that keep raw pointers).
    """

    SOURCE_KEY = "source"

    def __init__(self, source: BaseNode[dict], *, batch_size: int, reuse_buffers: bool = True,
                 stats: Stats | None = None) -> None:
        super().__init__()
        if batch_size <= 0:
            raise ValueError(f"batch_size={batch_size} should be a positive int")
        self.source, self.batch_size, self.stats = source, batch_size, stats if stats is not None else Stats()
        self._buffers = BufferPool() if reuse_buffers else None

    def reset(self, initial_state: dict | None = None) -> None:
        super().reset(initial_state)
        self.source.reset(initial_state[self.SOURCE_KEY] if initial_state else None)

    def next(self) -> dict:
        samples: list[dict] = []
        for _ in range(self.batch_size):
            try:
                samples.append(next(self.source))
            except StopIteration:
                break
        if not samples:
            raise StopIteration
        self.stats.add("batches")
        return collate(samples, self._buffers)

    def get_state(self) -> dict[str, Any]:
        return {self.SOURCE_KEY: self.source.state_dict()}

    def close(self) -> None:
        """Release the upstream's workers."""
        if hasattr(self.source, "close"):
            self.source.close()
