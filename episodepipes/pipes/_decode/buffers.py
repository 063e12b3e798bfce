"""Large arrays handed out again only once nothing made from them is alive (no page faults on reuse).

The ownership rule is explicit: the pool keeps the *memory* (an anonymous mapping) and lends it out
wrapped in a fresh array, the *lease*. numpy makes every view of the lease keep the lease alive (a
view's ``base`` stops at the first array over memory numpy does not own), `torch.from_numpy` keeps
its array alive, and so do tensors viewing that tensor; so the lease is gone exactly when no batch,
tensor or view made from it is left. The pool holds only a weak reference to it, and lends the memory
again once that reference is dead. A consumer may keep any batch as long as it likes.
"""

from __future__ import annotations

import mmap
import os
import tempfile
import weakref

import numpy as np

# MAP_POPULATE: the pages are faulted in by the kernel in one go when the memory is made, not one fault per 4 KB as
# the decode workers first write each row (a ring is made once and reused, so this is paid once)
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)
_PRIVATE = {"flags": mmap.MAP_PRIVATE | _POPULATE} if hasattr(mmap, "MAP_PRIVATE") else {}
_SHARED = {"flags": mmap.MAP_SHARED | _POPULATE} if hasattr(mmap, "MAP_SHARED") else {}


class Lendable:
    """One buffer's memory and the weak reference to the array it is currently lent out as."""

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype | type, *, shared: bool = False) -> None:
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        size = max(1, int(np.prod(self.shape)) * self.dtype.itemsize)
        # shared: decode processes write into it, over a descriptor passed to them when they start (they are forked
        # by a fork server, not by this process, so they inherit nothing); private: only this process does
        self.fd = _shared_fd(size) if shared else -1
        if shared:
            weakref.finalize(self, os.close, self.fd)
        self.memory = mmap.mmap(self.fd, size, **_SHARED) if shared else mmap.mmap(-1, size, **_PRIVATE)
        self._lease: weakref.ref[np.ndarray] | None = None

    def free(self) -> bool:
        """Nothing made from the last lease is alive (or it was never lent)."""
        return self._lease is None or self._lease() is None

    def view(self) -> np.ndarray:
        """An array over the memory that is not a lease (what forked workers write through)."""
        return np.ndarray(self.shape, self.dtype, buffer=self.memory)

    def lend(self) -> np.ndarray:
        """A new lease over the memory; call only when `free`."""
        lease = self.view()
        self._lease = weakref.ref(lease)
        return lease


def map_shared(fd: int, size: int) -> mmap.mmap:
    """``size`` bytes of the shared memory behind ``fd``, mapped with their pages already in (a decode process's
    view of a ring, `slabs.attach`)."""
    return mmap.mmap(fd, size, **_SHARED)


def _shared_fd(size: int) -> int:
    """A descriptor of ``size`` bytes of shared memory backed by no file on disk (a memfd where there is one)."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("episodepipes-ring", os.MFD_CLOEXEC)
    else:
        fd, path = tempfile.mkstemp(prefix="episodepipes-ring-")
        os.unlink(path)
    os.ftruncate(fd, size)
    return fd


class BufferPool:
    """Arrays to decode or stack into, lent again once every tensor and view made from them is gone.

    A fresh large buffer costs a page fault per 4 KB on first touch; memory lent again does not.
    At most ``keep`` buffers of each shape and dtype are kept; beyond that, buffers are not pooled.
    """

    def __init__(self, keep: int = 8) -> None:
        self.keep = keep
        self._kept: dict[tuple, list[Lendable]] = {}

    def get(self, shape: tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
        kept = self._kept.setdefault((tuple(shape), np.dtype(dtype).str), [])
        for b in kept:
            if b.free():
                return b.lend()
        b = Lendable(shape, dtype)
        if len(kept) < self.keep:
            kept.append(b)
        return b.lend()


def consecutive_rows(arrays: list[np.ndarray]) -> np.ndarray | None:
    """``base[j:j+n]`` when ``arrays`` are rows ``j..j+n-1`` of one contiguous, writable base array, else None.

    That is how `Decoder` lays out a batch's frames, so stacking them is a view, not a copy. A read-only base
    is not a batch buffer but the bytes an array was read from (a scalar .npy member of a one-sample batch
    looks like one row of them): a tensor over it would be a writable tensor over read-only memory.
    """
    a0 = arrays[0]
    base = a0.base
    if not isinstance(base, np.ndarray) or not base.flags.c_contiguous or not base.flags.writeable \
            or base.shape[1:] != a0.shape:
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
