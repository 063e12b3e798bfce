"""`InOrder`: calls run on a per-pass pool of threads or processes, results handed back in call order.

Consecutive calls may share one task (``chunk``): for processes whose results come back pickled, a task
costs the parent two messages and wake-ups of the pool's threads, CPU that 2-core machines lack.

Why not torchdata's `ParallelMapper` (``benchmarks/executor_probe.py`` runs both side by side): on
threads it is as fast, but its workers start at ``reset`` (the gate contract wants the first ``next()``),
and it has no ``shutdown()``: workers stop when its iterator is garbage-collected. On processes its first
batch and its shutdown are several times slower, and its workers outlive the shutdown while they drain
their queue, so a pass would not release them. One executor for both methods keeps one lifecycle.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from episodepipes.pipes import _pool
from episodepipes.pipes.stats import Stats

T = TypeVar("T")


@dataclass(frozen=True)
class _Task(Generic[T]):
    tag: T
    future: Future
    pos: int | None  # its place in a chunk's result list; None: the task is this call alone


def run_chunk(calls: list[tuple[Callable[..., Any], tuple]]) -> list[Any]:
    """In a worker: ``fn(*args)`` for each call of a chunk (one message each way, not one per call)."""
    return [fn(*args) for fn, args in calls]


class InOrder(Generic[T]):
    """A pool for one pass plus the calls in flight, each with a ``tag`` it comes back with."""

    def __init__(self, method: str, num_workers: int, stats: Stats, *, chunk: int = 1) -> None:
        self.chunk = chunk
        self._pool = _pool.Pool(method, num_workers, stats)
        self._queued: list[tuple[T, Callable[..., Any], tuple]] = []  # not yet sent: a chunk being filled
        self._tasks: deque[_Task[T]] = deque()

    def __len__(self) -> int:
        return len(self._queued) + len(self._tasks)

    def first(self) -> T:
        """The tag of the oldest call not yet handed back."""
        return self._tasks[0].tag if self._tasks else self._queued[0][0]

    def put(self, tag: T, fn: Callable[..., Any], *args: Any) -> None:
        self._queued.append((tag, fn, args))
        if len(self._queued) >= self.chunk:
            self.flush()

    def flush(self) -> None:
        """Send the queued calls: one task for a chunk, or for one call."""
        calls, self._queued = self._queued, []
        if not calls:
            return
        if self.chunk == 1 and len(calls) == 1:
            tag, fn, args = calls[0]
            self._tasks.append(_Task(tag, self._pool.submit(fn, *args), None))
            return
        fut = self._pool.submit(run_chunk, [(fn, args) for _, fn, args in calls])
        self._tasks.extend(_Task(tag, fut, i) for i, (tag, _, _) in enumerate(calls))

    def get(self) -> tuple[T, Any]:
        """The oldest call's (tag, result), waiting for it; flushes a partial chunk it would wait on."""
        if not self._tasks:
            self.flush()
        task = self._tasks.popleft()
        result = task.future.result()
        return task.tag, result if task.pos is None else result[task.pos]

    @property
    def idle(self) -> bool:
        """No task is running: a partial chunk would otherwise wait for calls that may never come."""
        return not self._tasks

    def close(self) -> None:
        """Drop the calls in flight and stop the workers (threads joined, processes ended)."""
        for task in self._tasks:
            task.future.cancel()
        self._tasks.clear()
        self._queued.clear()
        self._pool.close()
