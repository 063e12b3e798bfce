"""A per-pass worker pool: threads (default) or processes started from a clean state (`episodepipes._forkserver`:
a fork server, or spawn where there is none), always stopped by `Pool.close` or, for a pool dropped without it, by
its finalizer.

Process workers inherit nothing of this pass, so the shared batch rows are given to them as descriptors
(`_slabs.Ring`). Workers die with the process running the pass, even killed outright (`_forkserver.worker_start`), and
`_executor.InOrder` bounds how long it waits on one.
"""

from __future__ import annotations

import os
import signal
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any

from episodepipes import _forkserver
from episodepipes.pipes._decode import slabs as _slabs
from episodepipes.pipes.stats import Stats

THREAD_PREFIX = "episodepipes-decode"
PRELOAD = ("episodepipes.pipes.decode", "episodepipes.pipes.train")  # what a fork server started here imports first


def _init_process(ring: _slabs.Ring | None = None, owner: int | None = None) -> None:
    """A decode process, first thing: made safe and fast (`_forkserver.worker_start`) and given the pass's shared
    batch rows (`_slabs.attach`), which a fork server's child cannot inherit.

    Do not call `cv2.setNumThreads` here: it was seen to wait forever on the parent's pool in a forked child.
    """
    _forkserver.worker_start(owner)
    if ring is not None:
        _slabs.attach(ring)


def shares_memory() -> bool:
    """Whether decode processes can be given the shared batch rows (`_slabs.Ring`): their descriptors are passed
    along as a fork server starts them; elsewhere their frames come back pickled."""
    return _forkserver.start_method() == "forkserver"


def _stop(ex: Executor) -> None:
    """Cancel queued work and stop the workers; wait for them unless called from one of them (a
    finalizer can run in any thread, and a thread cannot join itself)."""
    ex.shutdown(wait=not threading.current_thread().name.startswith(THREAD_PREFIX), cancel_futures=True)


class Pool:
    """``num_workers`` threads or processes for one pass; counts them in ``stats["workers_started"]``.

    `close` stops them; a pool dropped without it is stopped by its finalizer (an abandoned pass). ``ring``: the
    shared batch rows process workers write into (given to each as it starts).
    """

    def __init__(self, method: str, num_workers: int, stats: Stats, ring: _slabs.Ring | None = None) -> None:
        self._ex: Executor
        if method == "process":
            self._ex = ProcessPoolExecutor(num_workers, mp_context=_forkserver.context(PRELOAD),
                                           initializer=_init_process, initargs=(ring, os.getpid()))
        else:
            self._ex = ThreadPoolExecutor(num_workers, thread_name_prefix=THREAD_PREFIX)
        self._finalizer = weakref.finalize(self, _stop, self._ex)
        self._seen: dict[int, Any] = {}  # pid -> process, as the executor starts them (`describe`)
        self._stats = stats
        stats.add("workers_started", num_workers)

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        fut = self._ex.submit(fn, *args)
        procs = getattr(self._ex, "_processes", None)  # no public list of a ProcessPoolExecutor's workers
        if procs and len(procs) != len(self._seen):
            self._seen.update(procs)
        return fut

    def describe(self) -> str:
        """The workers, for an error: pids and how each ended, or the threads' name prefix."""
        if not isinstance(self._ex, ProcessPoolExecutor):
            return f"threads {THREAD_PREFIX}-*"
        return _forkserver.listed(sorted(self._seen.items()))

    def describe_broken(self) -> str:
        """`describe` for a process pool a worker's death broke, that worker first, once the pool has stopped.

        The executor stops the other workers itself (SIGTERM) and reaps them all; this waits for that before reading
        any exit code. A worker's exit code comes from the fork server through one pipe, read once: a second thread
        reading it at the same time (this one, while the executor reaps) finds it gone, and multiprocessing then
        reports 255 for a worker SIGKILLed."""
        self._finalizer()
        stopped = -signal.SIGTERM  # how the executor ends the workers still running when one dies
        return _forkserver.listed(sorted(self._seen.items(), key=lambda kv: (kv[1].exitcode == stopped, kv[0])))

    def _count_cpu(self) -> None:
        """Add the process workers' CPU time so far to ``stats["worker_cpu_us"]``, read from ``/proc`` before they
        exit: a fork server's children are not this process's, so ``RUSAGE_CHILDREN`` never counts them."""
        ticks = 0
        for pid in self._seen:
            try:
                with open(f"/proc/{pid}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
                ticks += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of proc(5))
            except (OSError, ValueError, IndexError):  # gone already, or no /proc here
                continue
        if ticks:
            self._stats.add("worker_cpu_us", ticks * 1_000_000 // os.sysconf("SC_CLK_TCK"))

    def abort(self) -> None:
        """Kill process workers (a stuck one would never take the stop message), then stop the pool."""
        for p in list(self._seen.values()):
            if p.exitcode is None:
                p.kill()
        if isinstance(self._ex, ThreadPoolExecutor):  # a stuck thread cannot be joined: leave it
            self._finalizer.detach()
            self._ex.shutdown(wait=False, cancel_futures=True)
        else:
            self._finalizer()

    def close(self) -> None:
        """Cancel queued work and wait for every worker to exit (threads joined, processes reaped)."""
        if self._finalizer.alive and self._seen:
            self._count_cpu()
        self._finalizer()
