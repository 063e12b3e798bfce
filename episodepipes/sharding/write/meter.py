"""Progress of a shard write on stderr: a tqdm bar on a terminal, a plain line every few seconds otherwise.

A bar redrawn with carriage returns is unreadable in a Slurm or CI log, and tqdm shows nothing
at all when stderr is not a terminal; a log needs whole lines, at a pace that keeps it short.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


def _duration(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}h{s // 60 % 60:02d}m{s % 60:02d}s" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


class Meter:
    """Counts episodes and frames of a write and shows them; use as a context manager.

    ``every`` is the seconds between two lines when ``stream`` is not a terminal; ``enabled=False``
    shows nothing (counting still works, for the summary).
    """

    def __init__(self, total: int, initial: int, *, enabled: bool, every: float = 10.0,
                 stream: TextIO | None = None) -> None:
        self.total, self.done, self.frames = total, initial, 0
        self._initial = initial
        self.stream = stream if stream is not None else sys.stderr
        self.every = every
        self.t0 = time.perf_counter()
        self._last = self.t0
        isatty = getattr(self.stream, "isatty", None)
        tty = bool(isatty and isatty())
        self._bar = None
        self._lines = enabled and not tty
        if enabled and tty:
            from tqdm import tqdm

            self._bar = tqdm(total=total, initial=initial, unit="ep", desc="episodes", file=self.stream,
                             dynamic_ncols=True)

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.t0

    def rate(self) -> float:
        """Frames per second so far."""
        return self.frames / max(self.seconds, 1e-9)

    def update(self, frames: int) -> None:
        """One more episode (``frames`` of it written now; 0 for a skipped one)."""
        self.done += 1
        self.frames += frames
        if self._bar is not None:
            self._bar.update(1)
            self._bar.set_postfix_str(f"{self.rate():.0f} frames/s", refresh=False)
        elif self._lines and time.perf_counter() - self._last >= self.every:
            self._last = time.perf_counter()
            self.stream.write(self.line() + "\n")
            self.stream.flush()

    def line(self) -> str:
        """``episodes 5/16, 120 frames/s, elapsed 0m04s, ETA 0m09s``."""
        eps = (self.done - self._initial) / max(self.seconds, 1e-9)
        eta = _duration((self.total - self.done) / eps) if eps > 0 else "?"
        return (f"episodes {self.done}/{self.total}, {self.rate():.0f} frames/s, "
                f"elapsed {_duration(self.seconds)}, ETA {eta}")

    def __enter__(self) -> Meter:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.close()
