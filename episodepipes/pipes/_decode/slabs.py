"""Batch-shaped buffers that decode workers write frames into, so collation copies no pixels.

A slab is one ``[slab, 3, H, W]`` uint8 array per camera; sample ``i`` of a batch is row ``i``.
Threads share memory, so any array works. Decode processes write into a fixed ring of shared
memory made before they start, whose descriptors they are given when they start (`Ring`, `attach`: they come
from a fork server and inherit nothing); a worker names its row by ``(ring, slab, row)``. A slab is reused
only once nothing the consumer holds points into it: the consumer gets leases of the ring's memory
(`episodepipes.pipes._decode.buffers`), the workers write through arrays of their own over the same memory.
"""

from __future__ import annotations

import itertools
import os
import weakref
from multiprocessing import reduction
from typing import Any

import numpy as np

from episodepipes.pipes._decode.buffers import BufferPool, Lendable, map_shared

Shapes = dict[str, tuple[int, ...]]  # camera -> its row's shape: [3, H, W], or [steps, 3, H, W] (a window)
_RINGS: dict[int, list[dict[str, np.ndarray]]] = {}  # arrays over each ring: the parent's, or a worker's (`attach`)
_tokens = itertools.count()


class Ring:
    """A ring's memory as a decode process gets it: pickled while the process starts, its descriptors passed along
    (`multiprocessing.reduction.DupFd`), mapped again there by `attach`."""

    def __init__(self, token: int, slabs: list[dict[str, tuple[int, tuple[int, ...]]]]) -> None:
        self.token, self.slabs = token, slabs  # per slab: camera -> (descriptor, shape)

    def __reduce__(self) -> tuple:
        return _rebuild, (self.token, [{c: (reduction.DupFd(fd), shape) for c, (fd, shape) in s.items()}
                                       for s in self.slabs])


def _rebuild(token: int, slabs: list[dict[str, tuple[Any, tuple[int, ...]]]]) -> Ring:
    return Ring(token, [{c: (dup.detach(), shape) for c, (dup, shape) in s.items()} for s in slabs])


def attach(ring: Ring) -> None:
    """In a decode process, as it starts: map ``ring``'s memory, for `worker_rows`."""
    arrays = []
    for slab in ring.slabs:
        got = {}
        for c, (fd, shape) in slab.items():
            size = max(1, int(np.prod(shape)))
            try:
                got[c] = np.ndarray(shape, np.uint8, buffer=map_shared(fd, size))
            finally:
                os.close(fd)
        arrays.append(got)
    _RINGS[ring.token] = arrays


def worker_rows(addr: tuple[int, int, int]) -> dict[str, np.ndarray]:
    """In a decode process: the rows named by ``addr`` in the ring it was given (`attach`)."""
    ring, slab, row = addr
    return {c: a[row] for c, a in _RINGS[ring][slab].items()}


class Slabs:
    """Hands out the next batch row per camera, starting a new slab every ``size`` rows."""

    def __init__(self, size: int, buffers: BufferPool | None = None) -> None:
        self.size = size
        self._pool = buffers if buffers is not None else BufferPool(keep=16)
        self._cur: dict[str, np.ndarray] = {}
        self._row = size
        self._ring: list[dict[str, Lendable]] | None = None
        self._sharing = False  # this pass's workers are processes writing into the ring
        self._token = -1
        self._slab = -1
        self._shapes: Shapes | None = None  # what the current slab was made for

    def share(self, shapes: Shapes, count: int) -> None:
        """Have a ring of ``count`` shared slabs for ``shapes`` (kept from the last pass if it fits);
        call before starting the workers, which are given it (`ring`)."""
        ring = self._ring
        if ring is None or len(ring) < count or {c: b.shape[1:] for c, b in ring[0].items()} != shapes:
            self.drop_ring()
            self._ring = [{c: Lendable((self.size, *s), np.uint8, shared=True) for c, s in shapes.items()}
                          for _ in range(count)]
            self._token = next(_tokens)
            _RINGS[self._token] = [{c: b.view() for c, b in slab.items()} for slab in self._ring]
            weakref.finalize(self, _RINGS.pop, self._token, None)
        self._cur, self._row, self._sharing = {}, self.size, True

    def ring(self) -> Ring | None:
        """What decode processes need to write into this pass's ring (`attach`), or None when there is none."""
        if self._ring is None or not self._sharing:
            return None
        return Ring(self._token, [{c: (b.fd, b.shape) for c, b in slab.items()} for slab in self._ring])

    def unshare(self) -> None:
        """End of a pass: the next one starts a fresh slab (the ring stays for the next pass's workers)."""
        self._cur, self._row, self._sharing = {}, self.size, False

    def drop_ring(self) -> None:
        """Forget the ring (its memory lives on while the consumer holds batches made from it)."""
        _RINGS.pop(self._token, None)
        self._ring = None

    def next_rows(self, shapes: Shapes) -> tuple[dict[str, np.ndarray] | None, Any]:
        """(rows to decode into, what to send a process worker: ``(ring, slab, row)`` or None)."""
        # With no slab free (_cur empty), keep counting rows to the slab's end before trying again, so
        # slab boundaries stay on batch boundaries and later batches are views again, not copies.
        if self._row >= self.size or (self._cur and shapes is not self._shapes
                                      and {c: a.shape[1:] for c, a in self._cur.items()} != shapes):
            self._cur = {}  # drop ours first, so a slab only in-flight samples still use is not handed back
            self._cur = self._new_slab(shapes)
            self._row = 0
            self._shapes = shapes  # the same dict again (a caller's cached shapes) needs no comparison
        self._row += 1
        if not self._cur:
            return None, None
        rows = {c: a[self._row - 1] for c, a in self._cur.items()}
        return rows, ((self._token, self._slab, self._row - 1) if self._sharing else None)

    def _new_slab(self, shapes: Shapes) -> dict[str, np.ndarray]:
        if not self._sharing or self._ring is None:
            return {c: self._pool.get((self.size, *s), np.uint8) for c, s in shapes.items()}
        for i, slab in enumerate(self._ring):
            if all(b.free() for b in slab.values()) and {c: b.shape[1:] for c, b in slab.items()} == shapes:
                self._slab = i
                return {c: b.lend() for c, b in slab.items()}
        return {}  # every shared slab is still held (or the sizes differ): this slab's frames come back pickled
