"""Releasing what a node owns: torchdata's ``shutdown()``, and a safety net for abandoned passes."""

from __future__ import annotations

from typing import Any


def shutdown_node(node: Any) -> None:
    """Call ``node.shutdown()``, or ``node.close()`` on nodes that only have that; nodes with neither own nothing."""
    stop = getattr(node, "shutdown", None) or getattr(node, "close", None)
    if stop is not None:
        stop()


class PassToken:
    """Which pass of a pipe is current, so an abandoned iterator's finalizer ends only its own pass."""

    def __init__(self) -> None:
        self.current = 0

    def next(self) -> int:
        self.current += 1
        return self.current


def end_abandoned(root: Any, token: PassToken, n: int) -> None:
    """Finalizer of pass ``n``'s iterator: shut ``root`` down unless a newer pass has begun since."""
    if token.current == n:
        shutdown_node(root)
