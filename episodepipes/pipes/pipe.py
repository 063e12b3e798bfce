"""`Pipe`: a sized, re-iterable iterable over a node graph (rooted at a `Gate`, or at `train_pipe`'s stacker).

``len()`` is fixed at construction from the plan, so asking for it starts nothing; ``iter()`` only
resets the (lazy) gate, so creating an iterator starts nothing either. Work begins at the first batch.
An iterator abandoned mid-pass (``break``, then dropped) ends its pass when it is collected, so its
workers do not outlive it.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import Any

from torchdata.nodes import BaseNode, Loader

from episodepipes.index import EpisodeIndex
from episodepipes.pipes._decode.lifecycle import PassToken, end_abandoned, shutdown_node
from episodepipes.pipes.gate import Gate
from episodepipes.pipes.stats import Stats


def check_rank(built_for: tuple[int, int] | None) -> None:
    """Refuse a pipe planned for another rank or world size than the running torch.distributed group."""
    if built_for is None:
        return
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    now = (dist.get_rank(), dist.get_world_size())
    if now != tuple(built_for):
        raise ValueError(
            f"this pipe was built for rank={built_for[0]}, world_size={built_for[1]}, but torch.distributed runs "
            f"rank={now[0]} of world_size={now[1]}: it was built before the process group started (in "
            "LightningDataModule.__init__, or eagerly by Hydra), so every rank would read the same batches; build "
            "pipes in val_dataloader()/train_dataloader() (with Hydra, `_partial_: true` and call the partial "
            "there), or pass rank= and world_size= explicitly")


class _Pass(Iterator[dict[str, Any]]):
    """One pass's iterator; when it is collected unfinished, its finalizer shuts the pass down."""

    def __init__(self, it: Iterator[dict[str, Any]], root: BaseNode, token: PassToken) -> None:
        self._it = it
        weakref.finalize(self, end_abandoned, root, token, token.next())

    def __next__(self) -> dict[str, Any]:
        return next(self._it)


class Pipe:
    """Iterate batches; each ``iter()`` starts a fresh pass (one pass at a time per pipe).

    Args:
        root: the graph's root node (a `Gate` for the metric and video pipes, a `BatchStacker` for train).
        length: batches per pass, fixed here so ``len()`` starts nothing.
        index: the `EpisodeIndex` the graph reads.
        stats: the counters the graph's nodes add to.
        gated: whether ``root`` is a `Gate` users bind a predicate to (``pipe.gate``).
        rank_world: the ``(rank, world_size)`` the plan was made for, when it was taken from the
            environment rather than given; ``iter()`` under torch.distributed refuses a group that
            disagrees (a pipe built before the process group started would have every rank read
            rank 0's batches). None: no check.
        restart: what ``iter()`` does with a state restored at the end of a pass: False (metric and video
            pipes) gives an empty pass, True (train) the next pass, as torchdata's
            ``Loader(restart_on_stop_iteration=...)``.

    Attributes:
        gate: the pipe's `Gate` when it is gated (video pipes), else None. Bind its predicate with
            ``pipe.gate.bind(fn)``.
        index: the `EpisodeIndex` it reads.
        stats: counters (`episodepipes.pipes.stats.KEYS`), including work done in worker processes.
    """

    def __init__(self, root: BaseNode, *, length: int, index: EpisodeIndex, stats: Stats, gated: bool,
                 rank_world: tuple[int, int] | None = None, restart: bool = False) -> None:
        self._root = root
        self._loader: Loader[dict[str, Any]] = Loader(root, restart_on_stop_iteration=restart)
        self._len = int(length)
        self.index, self.stats = index, stats
        if gated and not isinstance(root, Gate):
            raise TypeError(f"gated=True needs a Gate root, got {type(root).__name__}")
        self.gate: Gate | None = root if gated else None
        self._rank_world = rank_world
        self._passes = PassToken()

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[dict[str, Any]]:
        check_rank(self._rank_world)
        return _Pass(iter(self._loader), self._root, self._passes)

    def state_dict(self) -> dict[str, Any]:
        """Where the current (or last) pass is, as torchdata's `Loader` saves it; `load_state_dict` resumes there."""
        return self._loader.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make the next ``iter()`` continue from ``state``.

        Args:
            state: a `state_dict` of a pipe built with the same arguments (a train pipe checks it at once).
        """
        self._loader.load_state_dict(state)

    def shutdown(self) -> None:
        """End the current pass early, releasing its workers and files (a pass that runs to its end does
        this itself, and so does an abandoned iterator once it is collected)."""
        shutdown_node(self._root)

    close = shutdown  # the name callers used before torchdata's `shutdown`

    def __repr__(self) -> str:
        return f"Pipe(len={self._len}, gated={self.gate is not None}, index={str(self.index.root)!r})"
