"""Resume state of an unfinished write, kept in ``<out>/_progress.json`` and the append-only ``_progress.log``.

At a save (every ``save_every`` seconds at a finished shard, and on the way out: `episodepipes.sharding.write.saves`)
the writer records: the options, the finished shards, the index entries of the
episodes they complete, the skipped episodes, and a cursor (position in the job's episode list, first frame not yet
in a finished shard, and that episode's finished segments). The shards and episodes finished since the last save
are appended to ``_progress.log`` as one record (`episodepipes.sharding.write.progress_log`: JSON, then the
episodes' per-frame values as columns), fsynced; then the small ``_progress.json`` (the cursor, the skipped
episodes and how many bytes, shards and episodes of the log are recorded) is replaced atomically. So a save costs
the new shard, not everything written so far; a crash between the two leaves a log tail no progress names, which
the next save cuts off. The finished episodes' statistics are appended the same way to their own log
(`episodepipes.sharding.write.progress_stats`).

A ``_progress.json`` with the shards and episodes inline (older episodepipes, or a remote OUT, whose object store
cannot append) is read as before; the first local save after it logs everything once, then appends.

Encoding is deterministic, so a re-run re-encodes the cursor's episode, drops the
frames already written, and continues to output byte-identical to an uninterrupted run.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from episodepipes import safefile
from episodepipes.format import INDEX_NAME, shard_name
from episodepipes.index.check import SHARD_NAME, Where, _episode, _segments, check_extras, check_shards
from episodepipes.index.load import read_regular
from episodepipes.normstats import sidefile as statsfile
from episodepipes.sharding.write import progress_log

log = logging.getLogger(__name__)

PROGRESS_NAME = "_progress.json"
PROGRESS_LOG = "_progress.log"  # the finished shards and episodes, one line per save
JOBS_DIR = "_jobs"
STATS_LOG = "_progress.stats.log"  # `Progress.stats_log` names its records
_LOGGED = ("shards", "episodes", "stats_log")  # the lists kept in PROGRESS_LOG, not in PROGRESS_NAME


@dataclass
class Progress:
    options: dict
    shards: list[dict] = field(default_factory=list)
    episodes: list[dict] = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)
    position: int = 0  # index into the job's episode list
    frame: int = 0  # first frame of that episode not in a finished shard
    segments: list[dict] = field(default_factory=list)  # that episode's segments in finished shards
    splits: dict = field(default_factory=dict)  # where the finished episodes' splits came from: origin -> count
    stats: dict | None = None  # the finished episodes' `StatsFields.to_json()`, as older episodepipes saved them
    stats_log: list = field(default_factory=list)  # each STATS_LOG record's {"bytes", "sha256"}, in order
    log: dict | None = None  # {"bytes", "shards", "episodes", "stats_log"} of PROGRESS_LOG; None: none logged yet

    def save(self, out: Path, *, append: bool = True, upto: dict[str, int] | None = None) -> None:
        """Append the shards and episodes since the last save to the log, then replace the small progress file.
        ``append=False`` writes them all inline in the progress file instead (a remote OUT's object store).
        ``upto`` saves only the first ``upto["shards"]`` shards and ``upto["episodes"]`` episodes of the lists (a
        writer's live lists, which have grown since its `episodepipes.sharding.write.saves.Snapshot`)."""
        counts = {k: len(getattr(self, k)) for k in _LOGGED} | (upto or {})
        if not append:
            whole = {k: getattr(self, k)[:counts[k]] if k in _LOGGED else v for k, v in self.__dict__.items()
                     if k != "log"}
            safefile.write_file(out / PROGRESS_NAME, json.dumps(whole, sort_keys=True).encode())
            return
        done = self.log or {"bytes": 0, **dict.fromkeys(_LOGGED, 0)}
        if any(counts[k] > done[k] for k in _LOGGED) or self.log is None:
            line = progress_log.record(self.shards[done["shards"]:counts["shards"]], self.episodes, done["episodes"],
                                       self.stats_log[done["stats_log"]:counts["stats_log"]], end=counts["episodes"])
            with os.fdopen(safefile.open_kept(out / PROGRESS_LOG, os.O_WRONLY), "wb") as f:
                f.truncate(done["bytes"])  # a torn tail from a crash after an append (or an older log)
                f.seek(done["bytes"])
                f.write(line)
                f.flush()
                os.fsync(f.fileno())
            done = {"bytes": done["bytes"] + len(line), **{k: counts[k] for k in _LOGGED}}
        self.log = done
        small = {k: v for k, v in self.__dict__.items() if k not in _LOGGED}
        safefile.write_file(out / PROGRESS_NAME, json.dumps(small, sort_keys=True).encode())


def read(out: Path) -> dict:
    """The progress of the unfinished write in ``out`` as one dict, its logged shards and episodes inline (what a
    ``_progress.json`` of an older episodepipes held): for tools and tests; `start` checks it field by field."""
    file = out / PROGRESS_NAME
    raw = read_regular(file, "pass --overwrite to start over", error=ValueError)  # a FIFO there never blocks
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as e:  # not JSON, not UTF-8, 5000 digits
        raise ValueError(f"{file} is damaged ({e}); pass --overwrite to start over") from e
    if type(data) is not dict:
        raise ValueError(f"{file} is damaged (it should hold an object); pass --overwrite to start over")
    if data.get("log") is not None:
        data.update(_read_log(out, data["log"]))
    return data


def _read_log(out: Path, done: object) -> dict:
    """The shards, episodes and statistics records of the log's first ``done["bytes"]`` bytes, each line's sha256
    checked."""
    path, fix = out / PROGRESS_LOG, "pass --overwrite to start over"
    keys = ("bytes", *_LOGGED)
    if type(done) is not dict or set(done) != set(keys) or any(type(done[k]) is not int or done[k] < 0 for k in keys):
        raise ValueError(f"{out / PROGRESS_NAME} is damaged (log should be {{{', '.join(keys)}}} as counts); {fix}")
    if done["bytes"] == 0:
        raw = b""
    else:
        try:
            raw = read_regular(path, fix, error=ValueError)
        except FileNotFoundError:
            raise ValueError(f"{path} is missing, and {out / PROGRESS_NAME} records {done['bytes']} bytes of it; "
                             f"{fix}") from None
    if len(raw) < done["bytes"]:
        raise ValueError(f"{path} has {len(raw)} bytes, fewer than the {done['bytes']} {PROGRESS_NAME} records; {fix}")
    out_fields = progress_log.records(raw[:done["bytes"]], str(path), fix, _LOGGED)
    if any(len(out_fields[k]) != done[k] for k in _LOGGED):
        raise ValueError(f"{path} holds {len(out_fields['shards'])} shards and {len(out_fields['episodes'])} "
                         f"episodes, {PROGRESS_NAME} records {done['shards']} and {done['episodes']} (and "
                         f"{done['stats_log']} statistics records); {fix}")
    return out_fields


def finish(out: Path) -> None:
    """Remove the progress of a write whose index is written."""
    (out / PROGRESS_NAME).unlink(missing_ok=True)
    (out / PROGRESS_LOG).unlink(missing_ok=True)
    (out / STATS_LOG).unlink(missing_ok=True)


def clear(out: Path, *, jobs: bool = True) -> None:
    """Remove everything a write puts in ``out`` (and nothing else); ``jobs`` also the partial job outputs."""
    for pattern in (INDEX_NAME, INDEX_NAME + ".tmp", PROGRESS_NAME, PROGRESS_NAME + ".tmp", statsfile.NAME,
                    statsfile.NAME + ".tmp", STATS_LOG, PROGRESS_LOG,
                    "shard-*.tar", "shard-*.tar.tmp"):
        for p in out.glob(pattern):
            p.unlink()
    shutil.rmtree(out / "_spool", ignore_errors=True)
    if jobs:
        shutil.rmtree(out / JOBS_DIR, ignore_errors=True)


def start(out: Path, options: dict, *, overwrite: bool, finished_hint: Path | None = None,
          check: Callable[[list[dict]], None] | None = None, append: bool = True) -> tuple[Progress, bool]:
    """Prepare ``out`` for a write with ``options``: fresh, resumed, or refused. Returns (progress, resumed).

    ``finished_hint`` is another index that, when present, also marks the output finished
    (the merged index of a multi-job output). ``check(shards)`` replaces the check that the finished
    shards of a resumed write are still in ``out`` (a remote OUT keeps them in its object store). ``append``:
    saves append to the progress log (False for a remote OUT, whose progress file holds everything).
    """
    for done in (out / INDEX_NAME, finished_hint):
        if done is not None and done.exists() and not overwrite:
            raise FileExistsError(f"{done} exists: the output is finished; pass --overwrite to replace it, "
                                  "or choose another OUT")
    if overwrite:
        if out.exists():
            clear(out)
        if finished_hint is not None and finished_hint.exists():
            clear(finished_hint.parent, jobs=False)
    out.mkdir(parents=True, exist_ok=True)
    file = out / PROGRESS_NAME
    if file.exists():
        data = read(out)
        try:
            prog = Progress(**data)
        except TypeError as e:  # a field this episodepipes does not know, or one missing
            raise ValueError(f"{file} is damaged ({e}); pass --overwrite to start over") from e
        if type(prog.options) is not dict:
            raise ValueError(f"{file} is damaged (options should be an object); pass --overwrite to start over")
        if prog.options != options:
            changed = sorted(k for k in options.keys() | prog.options.keys()
                             if options.get(k) != prog.options.get(k))
            raise ValueError(f"{out} holds an unfinished write with other options (differ: {', '.join(changed)}); "
                             "re-run with the same options to resume, or pass --overwrite to start over")
        _check(prog, file)
        _drop_unrecorded(out, prog.shards, check)
        log.info("resuming %s after %d finished shards", out, len(prog.shards))
        return prog, True
    if any(out.glob("shard-*.tar")):
        raise ValueError(f"{out} holds shards but no index or {PROGRESS_NAME}, so it is not a resumable write; "
                         "pass --overwrite or choose an empty OUT")
    prog = Progress(options=options)
    prog.save(out, append=append)
    return prog, False


def _check(prog: Progress, file: Path) -> None:
    """Every field a resume uses, as the index check has them (a progress file is data on a disk too): the finished
    shards in order, the finished episodes and the one in flight filling exactly their frames, the cursor after
    the episodes finished or skipped. Anything else is refused naming the file and the fix."""
    fix = "pass --overwrite to start over"
    w = Where(file)
    try:
        sizes, samples = check_shards(w, {"shards": prog.shards})
        check_extras(w, {"skipped": prog.skipped})
        for i, s in enumerate(prog.shards):
            if s["name"] != shard_name(i):
                raise w.fail(f"shard {i}", f"name={s['name']!r} should be {shard_name(i)!r}")
        held, ids = [0] * len(sizes), set()
        for k, e in enumerate(w.seq({"episodes": prog.episodes}, "episodes", "the progress")):
            eid = _episode(w, e, k, sizes, held)
            if eid in ids:
                raise w.fail(f"episode {eid!r}", "this id appears twice")
            ids.add(eid)
        cursor = {"position": prog.position, "frame": prog.frame, "segments": prog.segments}
        position = w.num(cursor, "position", "the cursor")
        frame = w.num(cursor, "frame", "the cursor")
        if w.seq(cursor, "segments", "the cursor"):
            _segments(w, prog.segments, "the episode in flight", frame, sizes, held)
        elif frame:
            raise w.fail("the cursor", f"frame={frame} but the episode in flight has no finished segments")
        w.increasing()
        w.no_bool_crcs()
        if position != len(prog.episodes) + len(prog.skipped):
            raise w.fail("the cursor", f"position={position} should follow the {len(prog.episodes)} episodes "
                                       f"finished and {len(prog.skipped)} skipped")
        if held != samples:
            i = next(i for i, (a, b) in enumerate(zip(held, samples)) if a != b)
            raise w.fail(f"shard {i}", f"samples={samples[i]} but the episodes' segments put {held[i]} frames in it")
        if type(prog.splits) is not dict or not all(type(n) is int and n >= 0 for n in prog.splits.values()):
            raise w.fail("the progress", "splits should be an object of origin -> count")
    except ValueError as e:
        raise ValueError(f"{str(e).removesuffix('; re-shard with write --overwrite')}; {fix}") from None


def _drop_unrecorded(out: Path, shards: list[dict], check: Callable[[list[dict]], None] | None = None) -> None:
    """Delete temp files and shards finished after the last recorded progress (they are rewritten identically)."""
    if check is not None:
        check(shards)
    for s in shards if check is None else ():
        p = out / s["name"]
        if not p.exists() or p.stat().st_size != s["bytes"]:
            raise ValueError(f"{p}, finished before the interruption, is missing or changed; "
                             "pass --overwrite to start over")
    n_shards = len(shards)
    for p in out.glob("*.tmp"):
        p.unlink()
    for p in out.glob("shard-*.tar"):
        if SHARD_NAME.fullmatch(p.name) and int(p.stem.split("-")[1]) >= n_shards:  # another name is not ours
            p.unlink()
