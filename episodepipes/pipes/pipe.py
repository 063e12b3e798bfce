"""`Pipe`: a sized, re-iterable iterable over a node graph whose root is a `Gate`.

``len()`` is fixed at construction from the plan, so asking for it starts nothing; ``iter()`` only
resets the (lazy) gate, so creating an iterator starts nothing either. Work begins at the first batch.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torchdata.nodes import Loader

from episodepipes.index import EpisodeIndex
from episodepipes.pipes.gate import Gate
from episodepipes.pipes.stats import Stats


class Pipe:
    """Iterate batches; each ``iter()`` starts a fresh pass (one pass at a time per pipe).

    Attributes:
        gate: the pipe's `Gate` when it is gated (video pipes), else None. Bind its predicate with
            ``pipe.gate.bind(fn)``.
        index: the `EpisodeIndex` it reads.
        stats: counters (`episodepipes.pipes.stats.KEYS`), including work done in worker processes.
    """

    def __init__(self, root: Gate, *, length: int, index: EpisodeIndex, stats: Stats, gated: bool) -> None:
        self._root = root
        self._loader: Loader[dict[str, Any]] = Loader(root, restart_on_stop_iteration=False)
        self._len = int(length)
        self.index, self.stats = index, stats
        self.gate: Gate | None = root if gated else None

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self._loader)

    def state_dict(self) -> dict[str, Any]:
        return self._loader.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._loader.load_state_dict(state)

    def close(self) -> None:
        """End the current pass early, releasing its workers (a pass that runs to its end does this itself)."""
        self._root.close()

    def __repr__(self) -> str:
        return f"Pipe(len={self._len}, gated={self.gate is not None}, index={str(self.index.root)!r})"
