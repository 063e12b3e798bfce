"""`Saves`: when a write saves its resume progress: every ``every`` seconds and on the way out, not every shard.

A save appends what finished since the last one to the progress log and replaces the small progress file, fsyncing
both (`episodepipes.sharding.write.progress`). That is a few milliseconds, a share of the write that grows as
shards get cheaper (small frames, fast disks). So each finished shard only takes a `Snapshot` (counts into the
writer's append-only lists and the in-flight episode's cursor, never copies of the lists), and the newest snapshot
is written once ``every`` seconds have passed since the last save, at the last shard, and on the way out of a
write that fails or is interrupted. A resume then loses at most the shards finished since the last save: the
progress does not name them, so `episodepipes.sharding.write.progress.start` deletes their files and the resumed
write makes them again, byte for byte, as it does an interrupted shard's.

After a save that failed (a full disk, say) nothing more is saved: the progress on disk stays the last one
written whole, and the writer gives the shard whose save failed back its temporary name.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

SAVE_EVERY = 1.0  # seconds between two saves, by default


@dataclass(frozen=True)
class Snapshot:
    """The progress at a finished shard, as counts into append-only lists plus the small cursor.

    Attributes:
        shards: finished shards (the writer's first ``shards``).
        episodes: finished episodes (the writer's first ``episodes`` entries).
        skipped: skipped episodes (the first ``skipped`` of the run's list).
        position: the in-flight episode's place in the job's episode list (its length when none is in flight).
        frame: the in-flight episode's first frame not in a finished shard.
        segments: the in-flight episode's segments in finished shards (a new list; the segments are finished).
        splits: where the finished episodes' splits came from (a copy).
        stats: statistics parts folded and not yet saved, at the snapshot.
    """

    shards: int
    episodes: int
    skipped: int
    position: int
    frame: int
    segments: list[dict]
    splits: dict
    stats: int


def check_every(every: object, name: str = "save_every") -> float:
    """``every`` as seconds between saves, refused by ``name`` unless a finite number >= 0."""
    if isinstance(every, bool) or not isinstance(every, (int, float)) or not math.isfinite(every) or every < 0:
        raise ValueError(f"{name}={every!r} should be a finite number of seconds >= 0 between resume saves "
                         f"(0 saves after every shard; default {SAVE_EVERY})")
    return float(every)


class Saves:
    """Writes snapshots with ``write``: the newest every ``every`` seconds (0: each one), the last one always."""

    def __init__(self, every: float, write: Callable[[Snapshot], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.every, self._write_to, self.clock = check_every(every), write, clock
        self.unsaved: Snapshot | None = None  # taken since the last save, not written yet
        self.last = clock()  # when the last save ended (a fresh write saved its empty progress at the start)
        self.failed = False
        self.count = 0  # saves written
        self.saved_shards: int | None = None  # finished shards the last save recorded; None: no save yet

    def shard(self, snap: Snapshot, *, final: bool = False) -> None:
        """A shard finished with the progress ``snap``: save it if ``final`` or due, else keep it for later."""
        if final or self.every == 0 or self.clock() - self.last >= self.every:
            self._write(snap)
        else:
            self.unsaved = snap

    def flush(self) -> None:
        """Write the newest snapshot not yet saved (on the way out of a write); nothing after a failed save."""
        if self.unsaved is not None and not self.failed:
            self._write(self.unsaved)

    def _write(self, snap: Snapshot) -> None:
        self.unsaved = None
        try:
            self._write_to(snap)
        except BaseException:
            self.failed = True
            raise
        self.count += 1
        self.saved_shards = snap.shards
        self.last = self.clock()
