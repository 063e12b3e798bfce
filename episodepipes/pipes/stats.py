"""Pass counters shared by a pipe's nodes. Workers never write here: counts come back with results."""

from __future__ import annotations

KEYS = ("open_passes", "closed_passes", "workers_started", "bytes_read", "frames_read", "frames_decoded",
        "frames_corrupt", "batches", "worker_cpu_us")  # worker_cpu_us: process workers' CPU (`_decode.pool`)


class Stats(dict):
    """A ``dict`` of integer counters, all present from the start (so a reader never needs ``.get``)."""

    def __init__(self) -> None:
        super().__init__((k, 0) for k in KEYS)

    def add(self, key: str, n: int = 1) -> None:
        """Add to a counter.

        Args:
            key: the counter's name (one of `KEYS`; another name starts at 0).
            n: the amount to add, 1 by default.
        """
        self[key] = self.get(key, 0) + n
