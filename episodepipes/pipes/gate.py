"""`Gate`: a lazy switch in front of a subgraph that is built only on the passes that use it.

Lightning creates a throwaway iterator per val loader, and most validation passes render nothing.
So `reset` decides nothing and touches nothing; the first `next` of a pass asks the predicate, and
only an open pass builds the upstream (starting its workers, reading, decoding). When that pass ends,
the upstream is shut down and dropped, so no worker outlives it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from torchdata.nodes import BaseNode

from episodepipes.pipes._decode.lifecycle import shutdown_node
from episodepipes.pipes.stats import Stats

log = logging.getLogger(__name__)
T = TypeVar("T")


class Gate(BaseNode[T]):
    """Stream ``builder()``'s node on passes where ``predicate()`` is true (always, without a predicate).

    Args:
        builder: zero-argument callable returning a fresh upstream `BaseNode`; called once per open pass.
            Its ``shutdown()`` (or ``close()``) is called when the pass ends, to release its workers.
        predicate: zero-argument callable deciding, at the first ``next()`` of each pass, whether it is open.
        stats: counters for ``open_passes`` and ``closed_passes``.
    """

    UPSTREAM_KEY = "upstream"

    def __init__(self, builder: Callable[[], BaseNode[T]], predicate: Callable[[], bool] | None = None, *,
                 stats: Stats | None = None) -> None:
        super().__init__()
        if not callable(builder):
            raise TypeError(f"builder={builder!r} should be a zero-argument callable returning a BaseNode")
        self.builder, self.predicate = builder, predicate
        self.stats = stats if stats is not None else Stats()
        self._upstream: BaseNode[T] | None = None
        self._open: bool | None = None  # None: not decided yet this pass
        self._initial: dict | None = None

    def bind(self, predicate: Callable[[], bool] | None) -> None:
        """Set or replace the predicate (e.g. once trainer state exists); takes effect at the next pass.

        Args:
            predicate: a zero-argument callable whose truth opens a pass, asked at its first ``next()``;
                None opens every pass. A non-callable is refused with TypeError.
        """
        if predicate is not None and not callable(predicate):
            raise TypeError(f"predicate={predicate!r} should be a zero-argument callable returning bool")
        self.predicate = predicate

    def reset(self, initial_state: dict | None = None) -> None:
        super().reset(initial_state)
        self.shutdown()
        self._open = None
        self._initial = initial_state.get(self.UPSTREAM_KEY) if initial_state else None

    def next(self) -> T:
        if self._open is None:
            self._open = bool(self.predicate()) if self.predicate is not None else True
            self.stats.add("open_passes" if self._open else "closed_passes")
            log.debug("gate %s this pass", "open" if self._open else "closed")
            if self._open:
                self._upstream = self.builder()
                self._upstream.reset(self._initial)
                self._initial = None
        if self._upstream is None:
            raise StopIteration
        try:
            return next(self._upstream)
        except BaseException:  # the end of the pass, or an error that ends it: release the workers either way
            self.shutdown()
            raise

    def get_state(self) -> dict[str, Any]:
        up = self._upstream.state_dict() if self._upstream is not None else self._initial
        return {self.UPSTREAM_KEY: up}

    def shutdown(self) -> None:
        """End the open pass now: shut the upstream down (joining its workers) and drop it."""
        up, self._upstream = self._upstream, None
        if up is not None:
            # keep where the pass stopped, so the state still resumes there (an error ending the pass
            # must stay the error raised, hence no second one from here)
            with contextlib.suppress(Exception):
                self._initial = up.state_dict()
            shutdown_node(up)

    close = shutdown  # the name callers used before torchdata's `shutdown`
