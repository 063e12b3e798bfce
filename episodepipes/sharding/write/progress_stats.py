"""The statistics of an unfinished write's finished episodes: an append-only log beside ``_progress.json``.

Each record is the statistics of the episodes folded between two saves (or, first, the whole table a resumed
write started from) in the `episodepipes.normstats.sidefile` layout, folded with the writer's own rule: replaying the
records equals folding the episodes one by one. A save appends the record of the episodes since the last one, then
the progress file lists every record's size and sha256; a crash between the two leaves a tail the listed
records do not cover, which the next save cuts off. Resuming replays the records in order with the writer's
own fold (`StatsFields.add_loaded`), so the statistics equal an uninterrupted run's, byte for byte.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Mapping
from pathlib import Path

from episodepipes import safefile
from episodepipes.index.load import read_regular
from episodepipes.normstats import sidefile as statsfile
from episodepipes.normstats.fields import StatsFields, check_steps
from episodepipes.sharding.write.progress import PROGRESS_NAME, STATS_LOG, Progress

_MAX_RECORDS = 1 << 24


class StatsLog:
    """Appends the statistics ``fields`` fold from now on to ``out``'s log, at each `save`."""

    def __init__(self, out: Path, prog: Progress, fields: StatsFields) -> None:
        self.path, self.records = out / STATS_LOG, list(prog.stats_log)
        try:  # saved statistics whose records repeat or miss an episode would make an index that refuses them
            if prog.stats_log or prog.stats is not None:
                check_steps(fields, prog.episodes, f"{out / PROGRESS_NAME} (its saved statistics)")
        except ValueError as e:
            raise ValueError(f"{e}; the progress file is damaged: pass --overwrite to start over") from None
        self.pending: list[bytes] = []
        if not self.records and (fields.stats or fields.missing):  # resumed from an older progress file
            self.pending.append(statsfile.encode(fields.stats, fields.missing))
        self.fields = fields
        fields.unsaved = []
        self.lock = threading.Lock()  # `add` against a background `save` reading the fields
        self.taken = 0  # parts folded since this log was made that a `save` has taken

    def add(self, split: str, stats: Mapping, failed: Mapping) -> None:
        """Fold the next episode's statistics into ``fields`` (`StatsFields.add`), never while a `save` reads them."""
        with self.lock:
            self.fields.add(split, stats, failed)

    def folded(self) -> int:
        """Parts folded since this log was made: what a `save` of this moment passes as ``count`` (a count from
        the start, so a background save taking parts meanwhile does not shift it)."""
        with self.lock:
            return self.taken + len(self.fields.unsaved or ())

    def save(self, count: int | None = None) -> dict:
        """Append what was folded since the last save, up to the first ``count`` parts since this log was made
        (`folded`; None: all); returns the `Progress` field listing every record."""
        with self.lock:  # the writer folds more meanwhile when this runs in the background
            parts = self.fields.unsaved or []
            n = len(parts) if count is None else count - self.taken
            parts, self.fields.unsaved = parts[:n], parts[n:]
            self.taken += len(parts)
            new, self.pending = self.pending, []
            if parts and not self.records and not new and not self.fields.unsaved:  # a fresh write's first: all
                new.append(self.fields.encode())
                parts = []
        if parts:  # one record for them all: folding it equals folding them one by one (the rule `merge` uses)
            since = StatsFields()
            for split, stats, failed in parts:
                since.add(split, stats, failed)
            new.append(since.encode())
        if new:
            with os.fdopen(safefile.open_kept(self.path, os.O_WRONLY | os.O_APPEND), "ab") as f:
                f.truncate(sum(r["bytes"] for r in self.records))  # a torn tail from a crash after an append
                for raw in new:
                    f.write(raw)
                    self.records.append(statsfile.descriptor(raw)[statsfile.FIELD])
                f.flush()
                os.fsync(f.fileno())
        return {"stats_log": list(self.records)}


def read_log(out: Path, records: object, *, where: str) -> StatsFields:
    """The statistics the log's listed ``records`` fold to, each record's size and sha256 checked first."""
    if type(records) is not list or len(records) > _MAX_RECORDS:
        raise ValueError(f"{where}: stats_log should be a list of records")
    sizes = [statsfile.check_descriptor(r, f"{where}: stats_log entry {i}") for i, r in enumerate(records)]
    path = out / STATS_LOG
    try:
        raw = read_regular(path, "pass --overwrite to start over", error=ValueError)
    except FileNotFoundError:
        raise ValueError(f"{path} is missing, and {where} needs it") from None
    if len(raw) < sum(n for n, _ in sizes):
        raise ValueError(f"{path} has {len(raw)} bytes, fewer than the {sum(n for n, _ in sizes)} {where} lists")
    out_fields, at = StatsFields(), 0
    for i, (n, sha) in enumerate(sizes):
        rec = raw[at:at + n]
        if hashlib.sha256(rec).hexdigest() != sha:
            raise ValueError(f"{path}: record {i} does not match its sha256 in {where}")
        out_fields.add_loaded(*statsfile.decode(rec, where=f"{path} record {i}"))
        at += n
    return out_fields
