"""A per-pass worker pool: threads (default) or forked processes (spawned where there is no fork), always
stopped by `Pool.close` or, for a pool dropped without it, by its finalizer.

Why ``fork`` and not ``forkserver``: in a process that has imported torch and lightning, a forked
worker starts at once, while a forkserver worker re-imports the training script (Python 3.11's
forkserver does not preload ``__main__``: it asks for a ``main_path`` key that
``spawn.get_preparation_data`` never gives), and even preloading torch and lightning leaves every
pass paying for fresh interpreters. Workers are started per pass, so that start-up is paid often.

A forked worker is safe as long as it does not use a thread pool the parent had running, because
the pool's threads are not forked: a torch op big enough for the intra-op pool (OpenMP) hangs in a
forked child of a process that ran one, unless the child calls ``torch.set_num_threads(1)`` first
(what torch's DataLoader does in its own forked workers). ``cv2.resize`` (OpenCV's pthreads pool) was
not seen to hang, even with the parent's pool busy at the fork. Our workers use no CUDA, gloo or NCCL,
so the DDP threads do not matter.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import signal
import sys
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any

from episodepipes.pipes.stats import Stats

_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD = 64 << 20
THREAD_PREFIX = "episodepipes-decode"


def _init_process() -> None:
    """Make a forked decode process safe and fast.

    - One torch intra-op thread: the parent's OpenMP pool is not forked, and a parallel torch op
      (e.g. in a train ``transform``) would wait on it forever.
    - Default SIGTERM and ignored SIGINT: a handler inherited from the parent (Lightning installs one
      for SIGTERM) must not run in a worker; on Ctrl-C the parent closes the pool.
    - glibc serves each decoded frame (about 1 MB) with a fresh mmap by default, which costs hundreds of
      page faults per frame; a 64 MB threshold keeps them in the heap. Only our own workers are tuned.

    Do not call `cv2.setNumThreads` here: it was seen to wait forever on the parent's pool in a forked child.
    """
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)
    try:
        ctypes.CDLL("libc.so.6").mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)
    except OSError:  # not glibc: nothing to tune
        pass


def start_method() -> str:
    """``"fork"`` where the platform has it, else ``"spawn"``: a spawned worker inherits nothing, so
    `Decoder` then has its frames pickled back instead of written into inherited shared rows."""
    return "fork" if "fork" in mp.get_all_start_methods() else "spawn"


def _stop(ex: Executor) -> None:
    """Cancel queued work and stop the workers; wait for them unless called from one of them (a
    finalizer can run in any thread, and a thread cannot join itself)."""
    ex.shutdown(wait=not threading.current_thread().name.startswith(THREAD_PREFIX), cancel_futures=True)


class Pool:
    """``num_workers`` threads or processes for one pass; counts them in ``stats["workers_started"]``.

    `close` stops them; a pool dropped without it is stopped by its finalizer (an abandoned pass).
    """

    def __init__(self, method: str, num_workers: int, stats: Stats) -> None:
        self._ex: Executor
        if method == "process":
            self._ex = ProcessPoolExecutor(num_workers, mp_context=mp.get_context(start_method()),
                                           initializer=_init_process)
        else:
            self._ex = ThreadPoolExecutor(num_workers, thread_name_prefix=THREAD_PREFIX)
        self._finalizer = weakref.finalize(self, _stop, self._ex)
        stats.add("workers_started", num_workers)

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        return self._ex.submit(fn, *args)

    def close(self) -> None:
        """Cancel queued work and wait for every worker to exit (threads joined, processes reaped)."""
        self._finalizer()
