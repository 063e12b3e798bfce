"""A per-pass worker pool: threads (default) or forked processes, always stopped by `Pool.close`."""

from __future__ import annotations

import ctypes
import multiprocessing as mp
from collections.abc import Callable
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any

from episodepipes.pipes.stats import Stats

_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD = 64 << 20


def _init_process() -> None:
    """Tune a decode process we own: no mmap/munmap page faults per frame.

    glibc serves each decoded frame (about 1 MB) with a fresh mmap by default, which costs hundreds of
    page faults per frame; a 64 MB threshold keeps them in the heap. Only our own workers are tuned.
    (Do not call `cv2.setNumThreads` here: in a forked child it waits forever on the parent's pool.)
    """
    try:
        ctypes.CDLL("libc.so.6").mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)
    except OSError:  # not glibc: nothing to tune
        pass


def _context() -> Any:
    methods = mp.get_all_start_methods()
    return mp.get_context("fork" if "fork" in methods else "spawn")


class Pool:
    """``num_workers`` threads or processes for one pass; counts them in ``stats["workers_started"]``."""

    def __init__(self, method: str, num_workers: int, stats: Stats) -> None:
        self._ex: Executor
        if method == "process":
            self._ex = ProcessPoolExecutor(num_workers, mp_context=_context(), initializer=_init_process)
        else:
            self._ex = ThreadPoolExecutor(num_workers, thread_name_prefix="episodepipes-decode")
        stats.add("workers_started", num_workers)

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        return self._ex.submit(fn, *args)

    def close(self) -> None:
        """Cancel queued work and wait for every worker to exit (threads joined, processes reaped)."""
        self._ex.shutdown(wait=True, cancel_futures=True)
