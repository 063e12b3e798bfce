"""`InOrder`: calls run on a per-pass pool of threads or processes, results handed back in call order.

Consecutive calls may share one task (``chunk``): for processes whose results come back pickled, a task
costs the parent two messages and wake-ups of the pool's threads, CPU that 2-core machines lack.

Calls may carry a ``key`` (the GOP a video frame decodes from) and go to per-worker lanes (``lanes=True``):
every call of a key still in flight goes to the lane that has it, so one worker decodes a GOP's frames in
order while the others decode other GOPs. On one shared queue the chunks of a long GOP alternate between the
workers, which then take turns on that GOP's decoder (`episodepipes.codec.pool`), one frame at a time; processes
would each decode the GOP from its keyframe. A key not in flight starts a chunk on the least busy lane; a chunk
started that way takes new keys until it is full (a history window's random GOPs still go ``chunk`` per task).

Why not torchdata's `ParallelMapper` (``benchmarks/executor_probe.py`` runs both side by side): on
threads it is as fast, but its workers start at ``reset`` (the gate contract wants the first ``next()``),
and it has no ``shutdown()``: workers stop when its iterator is garbage-collected. On processes its first
batch and its shutdown are several times slower, and its workers outlive the shutdown while they drain
their queue, so a pass would not release them. One executor for both methods keeps one lifecycle.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from episodepipes.errors import WorkerError
from episodepipes.pipes._decode import pool as _pool
from episodepipes.pipes.stats import Stats

T = TypeVar("T")
STALL = 600.0  # seconds a pass waits on one task before it calls the worker stuck (a decode takes milliseconds)


@dataclass(frozen=True)
class _Task(Generic[T]):
    tag: T
    future: Future
    pos: int | None  # its place in a chunk's result list; None: the task is this call alone
    key: Hashable | None = None
    lane: int = 0


def run_chunk(calls: list[tuple[Callable[..., Any], tuple]]) -> list[Any]:
    """In a worker: ``fn(*args)`` for each call of a chunk (one message each way, not one per call)."""
    return [fn(*args) for fn, args in calls]


class InOrder(Generic[T]):
    """A pool for one pass plus the calls in flight, each with a ``tag`` it comes back with.

    ``lanes``: one single-worker pool per worker, and calls of one ``key`` kept on one of them (see the module
    docstring); otherwise one pool whose free workers take the next task.
    """

    def __init__(self, method: str, num_workers: int, stats: Stats, *, chunk: int = 1, lanes: bool = False,
                 ring: Any = None) -> None:
        self.chunk = chunk
        lanes = lanes and num_workers > 1
        self._pools = [_pool.Pool(method, 1, stats, ring) for _ in range(num_workers)] if lanes else [
            _pool.Pool(method, num_workers, stats, ring)]
        self._queued: list[tuple[T, Callable[..., Any], tuple, Hashable | None]] = []  # a chunk being filled
        self._lane = 0  # the queued chunk's lane
        self._fresh = False  # the queued chunk started on a lane chosen for it (not a key's lane): new keys join
        self._last = -1  # the lane chosen last for a key not in flight (ties go to the next one)
        self._tasks: deque[_Task[T]] = deque()
        self._sent: list[deque[tuple[Future, int]]] = [deque() for _ in self._pools]  # per lane: (task, calls)
        self._live: dict[Hashable, list[int]] = {}  # key in flight -> [its lane, its calls not handed back]
        self._held: tuple[Future | None, list[Any]] = (None, [])  # the chunk `get` hands results out of

    def __len__(self) -> int:
        return len(self._queued) + len(self._tasks)

    @property
    def keys(self) -> int:
        """Keys with calls in flight (queued, running or not yet handed back)."""
        return len(self._live)

    def room(self, limit: int, reach: int) -> bool:
        """Whether to take another call: fewer than ``limit`` in flight or, with lanes, fewer than ``reach`` while
        fewer keys are in flight than lanes plus the next key (a long GOP per lane, and the start of the next
        one), and until that next key's first chunk is sent."""
        n = len(self)
        if n < limit:
            return True
        lanes = len(self._pools)
        return lanes > 1 and n < reach and (self.keys <= lanes or bool(self._queued) and self.keys <= lanes + 1)

    def first(self) -> T:
        """The tag of the oldest call not yet handed back."""
        return self._tasks[0].tag if self._tasks else self._queued[0][0]

    def put(self, tag: T, fn: Callable[..., Any], *args: Any, key: Hashable | None = None) -> None:
        live = self._live.get(key) if key is not None else None
        if live is not None:  # the key's lane: its earlier calls are there
            if self._queued and live[0] != self._lane:
                self.flush()
            if not self._queued:
                self._lane, self._fresh = live[0], False
            live[1] += 1
        else:
            if self._queued and not self._fresh:
                self.flush()
            if not self._queued:
                self._lane, self._fresh = self._least_busy(), True
                self._last = self._lane
            if key is not None:
                self._live[key] = [self._lane, 1]
        self._queued.append((tag, fn, args, key))
        if len(self._queued) >= self.chunk:
            self.flush()

    def _least_busy(self) -> int:
        """The lane with the fewest calls not yet run; ties go round from the lane chosen last."""
        n = len(self._pools)
        if n == 1:
            return 0
        busy = [sum(k for f, k in self._running(i)) for i in range(n)]
        return min(range(n), key=lambda i: (busy[i], (i - self._last - 1) % n))

    def flush(self) -> None:
        """Send the queued calls: one task for a chunk, or for one call."""
        calls, self._queued = self._queued, []
        if not calls:
            return
        pool, lane = self._pools[self._lane], self._lane
        if self.chunk == 1 and len(calls) == 1:
            tag, fn, args, key = calls[0]
            fut = pool.submit(fn, *args)
            self._tasks.append(_Task(tag, fut, None, key, lane))
        else:
            fut = pool.submit(run_chunk, [(fn, args) for _, fn, args, _ in calls])
            self._tasks.extend(_Task(tag, fut, i, key, lane) for i, (tag, _, _, key) in enumerate(calls))
        self._running(lane).append((fut, len(calls)))

    def _running(self, lane: int) -> deque[tuple[Future, int]]:
        """The lane's tasks not yet run (its one worker runs them in order: the done ones lead)."""
        sent = self._sent[lane]
        while sent and sent[0][0].done():
            sent.popleft()
        return sent

    def get(self) -> tuple[T, Any]:
        """The oldest call's (tag, result), waiting for it; flushes a partial chunk it would wait on."""
        if not self._tasks:
            self.flush()
        task = self._tasks.popleft()
        if task.key is not None:
            live = self._live[task.key]
            live[1] -= 1
            if not live[1]:
                del self._live[task.key]
        if task.pos is None:
            return task.tag, self._result(task)
        if task.future is not self._held[0]:  # a chunk's first call: its results, kept for the chunk's others
            self._held = (task.future, self._result(task))
        return task.tag, self._held[1][task.pos]

    def _result(self, task: _Task[T]) -> Any:
        """The task's result, waiting at most `STALL` seconds; a worker that died or is stuck ends the pass with
        `WorkerError` naming it (its pool killed first), never a wait without end."""
        try:
            return task.future.result(timeout=STALL)
        except TimeoutError:
            if task.future.done():  # the call itself raised TimeoutError: its own error
                raise
            pool = self._pools[task.lane]
            who = pool.describe()
            self.abort()
            raise WorkerError(f"decode worker ({who}) returned nothing for {STALL:.0f} s: stuck (a lock "
                                    "held forever, a transform that never returns?); the pass is stopped") from None
        except BrokenProcessPool:
            who = self._pools[task.lane].describe_broken()  # before `abort`: exit codes read once the pool stopped
            self.abort()
            raise WorkerError(f"a decode worker died ({who}; exit code -9 is SIGKILL, often the out-of-memory "
                                    "killer); the pass is stopped: lower num_workers or the batch size") from None

    def abort(self) -> None:
        """`close` for a pass that cannot go on: process workers are killed, not waited for."""
        for pool in self._pools:
            pool.abort()
        self.close()

    @property
    def idle(self) -> bool:
        """The queued chunk's worker has nothing to run: a partial chunk would otherwise wait for calls that may
        never come (on one shared pool: no task is in flight at all)."""
        if len(self._pools) == 1:
            return not self._tasks
        return not self._running(self._lane)

    def close(self) -> None:
        """Drop the calls in flight and stop the workers (threads joined, processes ended)."""
        for task in self._tasks:
            task.future.cancel()
        self._tasks.clear()
        self._queued.clear()
        self._held = (None, [])
        self._live.clear()
        for pool in self._pools:
            pool.close()
