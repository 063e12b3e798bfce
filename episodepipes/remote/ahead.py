"""Read-ahead: the next few fetches of a known sequence run in background threads while the current is used.

A remote GET costs a round trip that local reads do not; a reader whose plan is known ahead (train_pipe's
next batches) hides it by asking before it needs the bytes. The fetches run in this process's threads
(never in a forked worker: the object store's runtime does not survive fork). An error of a fetch comes
out of `get` for the key that needed it, with its own message (the object and range).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class ReadAhead(Generic[K, V]):
    """``fetch(key)`` for consecutive keys; ``following(key)`` names the next one (None after the last).

    `get(key)` returns ``fetch(key)`` (fetched ahead, or now) and starts the next ``depth`` keys. A key
    asked out of turn (a resume) drops the fetches ahead that it made stale.
    """

    def __init__(self, fetch: Callable[[K], V], following: Callable[[K], K | None], *, depth: int = 2) -> None:
        if type(depth) is not int or depth < 0:
            raise ValueError(f"{depth=} should be an int >= 0")
        self._fetch, self._following, self.depth = fetch, following, depth
        self._pending: dict[K, Future[V]] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._current: tuple[K, V] | None = None

    def get(self, key: K) -> V:
        if self._current is not None and self._current[0] == key:
            return self._current[1]
        fut = self._pending.pop(key, None)
        wanted, k = [], key
        for _ in range(self.depth):
            k = self._following(k)  # type: ignore[assignment]
            if k is None:
                break
            wanted.append(k)
        for stale in [s for s in self._pending if s not in wanted]:
            self._pending.pop(stale).cancel()
        for k in wanted:  # started before this key's own wait, so they overlap with it
            if k not in self._pending:
                self._pending[k] = self._executor().submit(self._fetch, k)
        self._current = None  # the bytes of the last key go: memory holds at most depth + 1 fetches
        value = fut.result() if fut is not None else self._fetch(key)
        self._current = (key, value)
        return value

    def held(self) -> list[V]:
        """The fetched values kept now: the current key's and those fetched ahead (what the bound counts)."""
        done = [f.result() for f in list(self._pending.values()) if f.done() and not f.cancelled()
                and f.exception() is None]
        return ([] if self._current is None else [self._current[1]]) + done

    def close(self) -> None:
        """Drop the fetches ahead and stop the threads; `get` starts them again."""
        pending, self._pending, self._current = self._pending, {}, None
        for f in pending.values():
            f.cancel()
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max(1, self.depth), thread_name_prefix="episodepipes-ahead")
            weakref.finalize(self, self._pool.shutdown, wait=False, cancel_futures=True)
        return self._pool
