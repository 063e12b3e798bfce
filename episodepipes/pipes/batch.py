"""`BatchStacker`: decoded samples into batch dicts of tensors, without copying frames the decoder laid out.

A batch has one uint8 ``[B, 3, H, W]`` tensor per camera and one tensor per array key (both stacked
from the samples' arrays, in native byte order), ``frame`` (int64), ``timestamp`` (float64 seconds), ``valid`` (bool),
``episode`` and ``prompt`` (lists of str).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torchdata.nodes import BaseNode

from episodepipes.pipes._decode.buffers import BufferPool, consecutive_rows
from episodepipes.pipes._decode.lifecycle import shutdown_node
from episodepipes.pipes.links import RowsProvider
from episodepipes.pipes.stats import Stats

__all__ = ["BufferPool", "BatchStacker", "collate"]

LISTS = ("episode", "prompt")
SCALARS = {"frame": np.int64, "timestamp": np.float64, "valid": np.bool_}  # int64, float64 and bool tensors


def collate(samples: list[dict], buffers: BufferPool | None = None) -> dict[str, Any]:
    """Stack a list of decoded samples into one batch dict (see the module docstring).

    Args:
        samples: decoded sample dicts with the same keys, at least one; the first decides the keys.
        buffers: a pool the stacked arrays are written into, reused once no batch references them; None
            allocates fresh arrays. Rows the decoder already laid out side by side are used in place.
    """
    first = samples[0]
    out: dict[str, Any] = {k: [s[k] for s in samples] for k in LISTS}
    for k, dtype in SCALARS.items():  # through numpy: torch.tensor of a list costs several times more
        out[k] = torch.from_numpy(np.array([s[k] for s in samples], dtype))
    for k, v in first.items():
        if k in out:
            continue
        rows = [s[k] for s in samples]
        buf = consecutive_rows(rows) if isinstance(v, np.ndarray) else None
        if buf is None:  # not laid out by the decoder: stack (into a reused buffer)
            arr = np.asarray(v)
            shape = (len(samples), *arr.shape)
            # torch holds native byte order only: a ">f4" array is stacked into "<f4" here (same values)
            dt = arr.dtype if arr.dtype.isnative else arr.dtype.newbyteorder("=")
            buf = buffers.get(shape, dt) if buffers is not None else np.empty(shape, dt)
            _stack(rows, buf, arr.shape, dt)
        out[k] = torch.from_numpy(buf)
    return out


def _stack(rows: list, buf: np.ndarray, shape: tuple[int, ...], dtype: np.dtype) -> None:
    """``buf[i] = rows[i]`` for every row: in one copy where every row is an array of ``shape`` and ``dtype``
    (the per-row assignments cost more than the bytes), else row by row (numpy's casts and broadcasts)."""
    if all(type(r) is np.ndarray and r.shape == shape and r.dtype == dtype for r in rows):
        np.concatenate(rows, axis=None, out=buf.reshape(-1))
        return
    for i, r in enumerate(rows):
        buf[i] = r


class BatchStacker(BaseNode[dict]):
    """Group ``batch_size`` samples from ``source`` into a batch dict; the last batch may be short.

    Named for what it does, and not ``Collator``, which torchdata.nodes has too (a `Batcher` that
    collates with a function); this one stacks into tensors without copying rows the decoder laid out.

    Args:
        source: the node yielding decoded sample dicts (a `Decoder`).
        batch_size: samples per batch.
        reuse_buffers: stack arrays into buffers reused once nothing holds their last batch; False
            allocates every batch afresh (for consumers that keep raw pointers).
        stats: counters to add ``batches`` to.
        rows: the `links.RowsProvider` ``source`` is (its `Decoder`), asked here to decode into the rows of
            this node's batches (with ``reuse_buffers``), so collation copies no pixels. None: samples are
            stacked as they come (the same batches).
    """

    SOURCE_KEY = "source"

    def __init__(self, source: BaseNode[dict], *, batch_size: int, reuse_buffers: bool = True,
                 stats: Stats | None = None, rows: RowsProvider | None = None) -> None:
        super().__init__()
        if batch_size <= 0:
            raise ValueError(f"batch_size={batch_size} should be a positive int")
        self.source, self.batch_size, self.stats = source, batch_size, stats if stats is not None else Stats()
        self._buffers = BufferPool() if reuse_buffers else None
        if reuse_buffers and rows is not None:  # its samples come in batch order: lay them out so
            rows.batch_rows(batch_size)

    def reset(self, initial_state: dict | None = None) -> None:
        super().reset(initial_state)
        self.source.reset(initial_state[self.SOURCE_KEY] if initial_state else None)

    def next(self) -> dict:
        samples: list[dict] = []
        # reset() has initialised the source: BaseNode.__next__ would only check that again, per sample
        take = self.source.next
        for _ in range(self.batch_size):
            try:
                samples.append(take())
            except StopIteration:
                break
        if not samples:
            raise StopIteration
        self.stats.add("batches")
        return collate(samples, self._buffers)

    def get_state(self) -> dict[str, Any]:
        return {self.SOURCE_KEY: self.source.state_dict()}

    def shutdown(self) -> None:
        """Release the upstream's workers and files."""
        shutdown_node(self.source)

    close = shutdown  # the name callers used before torchdata's `shutdown`
