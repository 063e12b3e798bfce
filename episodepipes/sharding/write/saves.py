"""`Saves`: when a write saves its resume progress: every ``every`` seconds and on the way out, not every shard.

A save appends what finished since the last one to the progress log and replaces the small progress file, fsyncing
both (`episodepipes.sharding.write.progress`). That is a few milliseconds, a share of the write that grows as
shards get cheaper (small frames, fast disks). So each finished shard only takes a `Snapshot` (counts into the
writer's append-only lists and the in-flight episode's cursor, never copies of the lists), and the newest snapshot
is written once ``every`` seconds have passed since the last save, at the last shard, and on the way out of a
write that fails or is interrupted. A resume then loses at most the shards finished since the last save: the
progress does not name them, so `episodepipes.sharding.write.progress.start` deletes their files and the resumed
write makes them again, byte for byte, as it does an interrupted shard's.

A save that falls due runs on a background thread (one at a time), so the writer goes on with the next shard
instead of waiting for the record's encoding and the fsyncs: what a save reads is append-only up to the snapshot's
counts. The writer waits for it only at the last shard (saved in the foreground after the one in flight) and on
the way out; a shard that finishes while a save runs keeps its snapshot for the next save due. ``every=0`` saves
each shard in the foreground: its progress is on disk before the next shard starts.

After a save that failed (a full disk, say) nothing more is saved: the progress on disk stays the last one
written whole. A background save's error is raised at the next shard (or the wait at the end), where the
writer gives that shard back its temporary name, as it does a shard whose own save failed.
"""

from __future__ import annotations

import logging
import math
import threading
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
        stats: statistics parts folded since the write (re)started, at the snapshot (`StatsLog.folded`).
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
    """Writes snapshots with ``write``: the newest every ``every`` seconds (0: each one), the last one always.

    ``background``: a due save (``every`` > 0) runs on a thread of its own while the writer goes on; False runs
    every save in the caller's thread.
    """

    def __init__(self, every: float, write: Callable[[Snapshot], None],
                 clock: Callable[[], float] = time.monotonic, *, background: bool = True) -> None:
        self.every, self._write_to, self.clock = check_every(every), write, clock
        self.background = background and self.every > 0
        self.unsaved: Snapshot | None = None  # taken since the last save, not written yet
        self.last = clock()  # when the last save ended (a fresh write saved its empty progress at the start)
        self.failed = False
        self.count = 0  # saves written
        self.saved_shards: int | None = None  # finished shards the last save recorded; None: no save yet
        self._thread: threading.Thread | None = None  # the background save running, if any
        self._error: BaseException | None = None  # a background save's, until it is raised in the writer's thread

    def shard(self, snap: Snapshot, *, final: bool = False) -> None:
        """A shard finished with the progress ``snap``: save it if ``final`` or due, else keep it for later."""
        if self._thread is not None and (self.failed or not self._thread.is_alive()):
            self.wait()  # a background save that failed raises here, and nothing more is saved
        if self.failed:
            return
        if final or not self.background:
            if final or self.every == 0 or self.clock() - self.last >= self.every:
                self.wait()
                self.unsaved = None
                self._write(snap)
            else:
                self.unsaved = snap
        elif self._thread is None and self.clock() - self.last >= self.every:
            self.unsaved = None
            self._thread = threading.Thread(target=self._background, args=(snap,), name="episodepipes-save",
                                            daemon=True)
            self._thread.start()
        else:
            self.unsaved = snap

    def wait(self) -> None:
        """Wait for the background save running, if any; raise its error if it failed."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def flush(self) -> None:
        """Write the newest snapshot not yet saved (on the way out of a write), after the background save running;
        nothing after a failed save."""
        self.wait()
        if self.unsaved is not None and not self.failed:
            snap, self.unsaved = self.unsaved, None
            self._write(snap)

    def _background(self, snap: Snapshot) -> None:
        try:
            self._write(snap)
        except BaseException as e:  # raised in the writer's thread by `wait`
            self._error = e

    def _write(self, snap: Snapshot) -> None:
        try:
            self._write_to(snap)
        except BaseException:
            self.failed = True
            raise
        self.count += 1
        self.saved_shards = snap.shards
        self.last = self.clock()
