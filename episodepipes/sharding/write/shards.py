"""`write_shards`: a reader's episodes to a finished, resumable, deterministic shard folder.

Episodes are encoded in ``workers`` processes (results taken in task order, so output order never
depends on timing, with at most ``2 * workers`` episodes in flight, so a fast encoder cannot fill the
disk with spooled episodes) and appended by one writer in the parent, which is what makes the bytes
independent of ``workers``. With ``num_jobs > 1`` this job writes its contiguous block of the
sorted episode list into ``out/_jobs/job-NNNN/``; `episodepipes.sharding.merge` joins them.

Splits: an option's split (``val_episodes``) replaces the episode's own, ``val_fraction`` only fills in
episodes without one; `WriteResult.split_origins` counts where each came from. One writer per folder
(`episodepipes.sharding.write.lock`); a full disk is a `DiskFullError` that keeps every finished shard.

Statistics: each encoder also computes its episode's per-array statistics (`episodepipes.normstats.fields`),
and the writer folds them in episode order into the index's side file ``index.stats.bin`` (logged with the
progress, so a resumed write gets the same numbers); `merge` folds the jobs' tables the same way.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import json
import logging
import os
import shutil
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from episodepipes import safefile
from episodepipes.errors import DiskFullError  # noqa: F401 (re-export)
from episodepipes.format import INDEX_NAME, safe_episode_id
from episodepipes.normstats.sidefile import NAME as STATS_NAME
from episodepipes.sharding.episode import EpisodeError, EpisodeReader
from episodepipes.sharding.recompute import resumed_stats
from episodepipes.sharding.write.encode import EncodeOptions
from episodepipes.sharding.write.encoders import encoded, samples, start_early
from episodepipes.sharding.write.lock import write_lock
from episodepipes.sharding.write.meter import Meter
from episodepipes.sharding.write.plan import assign_splits, job_block
from episodepipes.sharding.write.progress import JOBS_DIR, Progress, finish, start
from episodepipes.sharding.write.progress_stats import StatsLog
from episodepipes.sharding.write.saves import SAVE_EVERY, Saves, Snapshot, check_every
from episodepipes.sharding.write.sigterm import saved_on_sigterm
from episodepipes.sharding.write.writer import ShardWriter
from episodepipes.shardio import is_url

if TYPE_CHECKING:
    from episodepipes.sharding.write.remote_out import RemoteOut

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class WriteOptions:
    """What decides the output bytes (recorded in the index and checked on resume), plus ``skip_bad``.

    ``skip_bad`` is left out of `to_dict`: it changes nothing unless an episode is bad, and then the
    index's ``skipped`` list records it. So a run that stopped at a bad episode can resume with it.

    Attributes:
        format: the format name, only recorded in the index.
        shard_size: target bytes per shard; a shard ends with the frame that reaches it.
        jpeg_quality: JPEG quality 1-100.
        resize: ``(H, W)`` every frame is resized to, or None to keep the source size.
        val_fraction: for episodes whose reader gives no split: val if among ``round(F * episodes)``
            chosen with ``seed``, else train. A split from the episode's metadata wins.
        val_episodes: these ids are val and every other episode train, whatever the metadata says.
        seed: seed of the ``val_fraction`` choice.
        skip_bad: skip episodes that fail to read or encode (listed in the index) instead of stopping.
        codec: "jpeg" (a JPEG per frame), or "h264"/"av1" packets (`EncodeOptions`); the index records it
            per camera, and leaves these three options out for JPEG. "copy": the source's own packets, as a
            reader made with ``copy=True`` gives them (`EpisodeData.packets`); the index records each camera's
            source codec and GOP, and leaves ``gop``/``crf`` out (they do not apply), and ``resize`` must be None.
        gop: h264/av1: frames per keyframe.
        crf: h264/av1: quality, lower is better; None for the codec's default.
        fast_decode: h264 only: x264's fastdecode tune (CAVLC, no deblocking), cheaper to decode for a few more
            bytes; what sparse reads and training windows want. Recorded in the options only when True, so
            indexes written without it stay as they were.
    """

    format: str
    shard_size: int = 512 * 10**6
    jpeg_quality: int = 90
    resize: tuple[int, int] | None = None
    val_fraction: float | None = None
    val_episodes: tuple[str, ...] | None = None
    seed: int = 0
    skip_bad: bool = False
    codec: str = "jpeg"
    gop: int = 2
    crf: int | None = None
    fast_decode: bool = False

    def __post_init__(self) -> None:
        if self.fast_decode and self.codec != "h264":
            raise ValueError(f"fast_decode=True applies to codec='h264' only, not codec={self.codec!r}; "
                             "drop it, or use codec='h264'")

    def to_dict(self) -> dict:
        """The options as the index's ``options`` record them (JSON lists, ``skip_bad`` left out)."""
        d = asdict(self)
        del d["skip_bad"]
        if not self.fast_decode:  # indexes written without it stay byte-identical to before the option
            del d["fast_decode"]
        if self.codec == "jpeg":  # JPEG indexes stay as they were before video codecs
            del d["codec"], d["gop"], d["crf"]
        elif self.codec == "copy":  # the source decides each camera's GOP, and nothing is encoded
            del d["gop"], d["crf"]
        d["resize"] = list(self.resize) if self.resize else None
        d["val_episodes"] = list(self.val_episodes) if self.val_episodes is not None else None
        return d


@dataclass(frozen=True)
class WriteResult:
    """What a `write_shards` call wrote.

    Attributes:
        out: the folder written (a job's folder under ``out/_jobs`` with ``num_jobs > 1``), or its URL.
        episodes: episodes in the output.
        frames: frames in the output.
        shards: shard files in the output.
        skipped: ``{"id", "error"}`` of each bad episode skipped under ``skip_bad``.
        resumed: True when this call continued an interrupted write.
        seconds: wall time of this call.
        frames_written: frames written by this call (fewer than ``frames`` after a resume).
        split_origins: where the splits came from, as counts: "metadata" (the episode's own), "option"
            (``val_fraction``/``val_episodes``) and "default" (train).
    """

    out: Path | str
    episodes: int
    frames: int
    shards: int
    skipped: list[dict]
    resumed: bool
    seconds: float = 0.0
    frames_written: int = 0
    split_origins: dict = field(default_factory=dict)




def job_dir(out: Path, job_index: int) -> Path:
    return out / JOBS_DIR / f"job-{job_index:04d}"


def source_fingerprint(ids: list[str], options: dict, num_jobs: int) -> str:
    """sha256 of what decides which episodes each job covers: jobs with equal fingerprints can be merged."""
    text = json.dumps({"episodes": ids, "options": options, "num_jobs": num_jobs}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def write_shards(reader: EpisodeReader, out: str | Path, opts: WriteOptions, *, workers: int = 1,
                 num_jobs: int = 1, job_index: int = 0, overwrite: bool = False,
                 progress_bar: bool = False, progress_every: float = 10.0,
                 staging: str | os.PathLike | None = None, save_every: float = SAVE_EVERY) -> WriteResult:
    """Shard ``reader`` into ``out``, resuming an interrupted run with the same options.

    One writer per folder: ``<folder>/_write.lock`` refuses a second one (`LockedError` names its pid
    and host). Raises `DiskFullError` when the disk fills up; everything finished stays, and the same
    call resumes once there is space.

    Args:
        reader: an `EpisodeReader`; it is pickled to the encoder processes.
        out: the output folder (new, or an interrupted write of the same source and options), or a remote
            root (``s3://bucket/prefix``, ``gs://...``): shards are uploaded as they finish, the index last
            (`episodepipes.sharding.write.remote_out`), and an interrupted write resumes from the remote progress.
        opts: what decides the output bytes; see `WriteOptions`.
        workers: encoder processes; the output does not depend on it.
        num_jobs: split the sorted episode list into this many contiguous blocks, one per job.
        job_index: this job's block, ``0..num_jobs-1``; it writes ``out/_jobs/job-NNNN`` for `merge_jobs`.
        overwrite: replace a finished or unfinished output instead of refusing or resuming.
        progress_bar: show progress on stderr: a bar on a terminal, else a line every ``progress_every``
            seconds (for Slurm and CI logs).
        progress_every: seconds between two progress lines when stderr is not a terminal.
        staging: a remote ``out`` only: the folder its local staging folder goes in (about one shard of
            disk); None for ``~/.cache/episodepipes/staging``.
        save_every: seconds between two resume saves (finite, >= 0; 0 saves after every shard). The last shard's
            progress is saved when the write ends, fails or is interrupted too, so a resume redoes at most the
            shards of the last ``save_every`` seconds (a kill -9 or a power cut); a remote ``out`` saves after every
            shard, which it uploads then. See `episodepipes.sharding.write.saves`.

    SIGTERM (Slurm's ``scancel`` and time limit) in the main thread saves that progress too, then ends the process by
    SIGTERM once the write has unwound (`episodepipes.sharding.write.sigterm`).
    """
    save_every = check_every(save_every)
    remote = None
    if is_url(out):
        from episodepipes.sharding.write.remote_out import RemoteOut

        remote = RemoteOut(str(out), staging)
        out = remote.staging
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"OUT {out} is a file; OUT is the folder to write into: choose a new or empty path")
    if not isinstance(reader, EpisodeReader):
        raise ValueError(f"{reader!r} is not an EpisodeReader (episode_ids() and read(id)); check --format")
    ids = reader.episode_ids()
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise ValueError(f"{reader!r}.episode_ids() must return a list of str; fix the reader")
    if not ids:
        raise ValueError(f"the source has no episodes ({reader!r}); check SRC and --format")
    if num_jobs > len(ids):
        raise ValueError(f"--num-jobs {num_jobs} is more than the {len(ids)} episodes of the source; "
                         f"pass at most --num-jobs {len(ids)}")
    _check_unique(ids)
    _check_copy(reader, opts)
    start_early(workers, opts.codec, type(reader).__module__)
    splits = assign_splits(ids, val_fraction=opts.val_fraction, val_episodes=opts.val_episodes, seed=opts.seed)
    block = list(job_block(len(ids), num_jobs=num_jobs, job_index=job_index))
    options = opts.to_dict()
    target = out if num_jobs == 1 else job_dir(out, job_index)
    source = source_fingerprint(ids, options, num_jobs)
    state = dict(options, num_jobs=num_jobs, job_index=job_index) if num_jobs > 1 else dict(options)
    state["source"] = source  # resuming from another episode list would mix two sources
    writer: ShardWriter | None = None
    run: _Run | None = None
    try:
        out.mkdir(parents=True, exist_ok=True)
        if num_jobs > 1:  # folders made inside OUT: a link planted in their place would take every file elsewhere
            safefile.make_dir(target.parent)
            safefile.make_dir(target)
        with saved_on_sigterm(target), write_lock(target):  # the handler goes last: after the lock is released
            if remote is not None:  # the remote state (finished? progress?) into the cleared staging folder
                remote.prepare(target, state, overwrite=overwrite, job=num_jobs > 1)
            prog, resumed = start(target, state, overwrite=overwrite and remote is None, append=remote is None,
                                  finished_hint=out / INDEX_NAME if num_jobs > 1 and remote is None else None,
                                  check=remote.check(target) if remote is not None else None)
            if remote is not None and not resumed:
                remote.save(target)  # a remote progress from the start: shards without one are never ours
            if prog.skipped and not opts.skip_bad:
                raise ValueError(f"the interrupted run in {target} skipped {[x['id'] for x in prog.skipped]}; "
                                 "resume with --skip-bad, or pass --overwrite to start over")
            writer = ShardWriter(target, shard_size=opts.shard_size, options=options, shards=prog.shards,
                                 episodes=prog.episodes, on_shard=None)
            extra: dict = {}
            if num_jobs > 1:
                extra["job"] = {"index": job_index, "num_jobs": num_jobs, "episodes": len(ids),
                                "first": block[0] if block else 0, "count": len(block),
                                "ids": [ids[p] for p in block], "source": source}
            run = _Run(reader, block, ids, splits, opts, target, state, prog, extra, remote,
                       save_every=0.0 if remote is not None else save_every)
            meter = run.write(writer, workers, Meter(len(block), prog.position, enabled=progress_bar,
                                                     every=progress_every))
            if remote is not None:
                remote.finish(target)
    except OSError as e:
        if e.errno not in DiskFullError.ERRNOS:
            raise
        kept = writer.shards[:run.saved_shards()] if writer is not None and run is not None else []
        where = f": {e.filename}" if e.filename else ""
        raise DiskFullError(
            f"{target}: the disk is full ({e.strerror}{where}) after {len(kept)} finished shards "
            f"({sum(s['bytes'] for s in kept) / 1e6:.1f} MB, kept); free space (or choose another OUT) "
            "and re-run the same command to resume") from e
    total = writer.episodes.frames
    where = remote.target_url(target) if remote is not None else target
    return WriteResult(where, len(writer.episodes), total, len(writer.shards), run.skipped, resumed,
                       seconds=meter.seconds, frames_written=meter.frames, split_origins=dict(run.origins))


class _Run:
    """The episode loop of one `write_shards` call, and the progress it saves as shards finish (`Saves`)."""

    def __init__(self, reader: EpisodeReader, block: list[int], ids: list[str], splits: dict,
                 opts: WriteOptions, target: Path, state: dict, prog: Progress, extra: dict,
                 remote: RemoteOut | None = None, *, save_every: float = SAVE_EVERY) -> None:
        self.reader, self.block, self.ids, self.splits, self.opts = reader, block, ids, splits, opts
        self.target, self.state, self.prog, self.extra, self.remote = target, state, prog, extra, remote
        self.skipped = list(prog.skipped)
        self.origins = Counter(prog.splits)
        self.position = prog.position  # relative to the block; read by `save` when a shard finishes
        self.logged = prog.log  # how much of the progress log the saved progress names
        self.stats = resumed_stats(target, prog)  # of the finished episodes, folded in output order
        self.stats_log = StatsLog(target, prog, self.stats)  # appends each finished episode's part at a save
        self.writer: ShardWriter = None  # type: ignore[assignment]  # set by `write`
        self.saves = Saves(save_every, self._save)
        self.resumed_shards = len(prog.shards)  # recorded by the progress this call started from

    def saved_shards(self) -> int:
        """Finished shards the progress on disk records (a resume keeps these, and redoes the rest)."""
        return self.resumed_shards if self.saves.saved_shards is None else self.saves.saved_shards

    def on_shard(self, w: ShardWriter) -> None:
        """A shard finished: snapshot the progress (counts, no copies of the lists) for `Saves` to write when due."""
        # no episode in flight happens only at the final flush: every episode has been added
        pend = w.pending or {"segments": [], "frame": 0}
        snap = Snapshot(shards=len(w.shards), episodes=len(w.episodes), skipped=len(self.skipped),
                        position=self.position if w.pending else len(self.block), frame=pend["frame"],
                        segments=list(pend["segments"]), splits=dict(self.origins), stats=self.stats_log.folded())
        self.saves.shard(snap, final=w.pending is None)

    def _save(self, snap: Snapshot) -> None:
        w = self.writer  # set by `write` before any shard finishes
        prog = Progress(options=self.state, shards=w.shards, episodes=w.episodes, skipped=self.skipped[:snap.skipped],
                        position=snap.position, frame=snap.frame, segments=snap.segments, splits=snap.splits,
                        log=self.logged, **self.stats_log.save(snap.stats))
        # an object store cannot append: all inline there
        prog.save(self.target, append=self.remote is None, upto={"shards": snap.shards, "episodes": snap.episodes})
        self.logged = prog.log  # only once the progress naming it is in place
        if self.remote is not None:  # upload the shard, then this progress; the local shard goes (saved every shard)
            self.remote.shard_done(self.target, w.shards[snap.shards - 1])

    def write(self, writer: ShardWriter, workers: int, meter: Meter) -> Meter:
        prog, opts, target = self.prog, self.opts, self.target
        enc_opts = EncodeOptions(jpeg_quality=opts.jpeg_quality, resize=opts.resize, codec=opts.codec, gop=opts.gop,
                                 crf=opts.crf, fast_decode=opts.fast_decode)
        spool = target / "_spool"
        shutil.rmtree(spool, ignore_errors=True)  # left by a killed run
        if workers > 1:
            safefile.make_dir(spool)  # a link in its place (which rmtree leaves) is refused
        override = opts.val_episodes is not None  # --val-fraction only fills in episodes without a split
        tasks = [(self.reader, self.ids[p], self.splits[self.ids[p]], override, enc_opts,
                  str(spool) if workers > 1 else None) for p in self.block[prog.position:]]
        writer.on_shard, self.writer = self.on_shard, writer
        try:  # the spool goes on failure too: on a full disk its files hold space the user needs
            with self._last_save(), writer, meter, \
                    contextlib.closing(encoded(tasks, workers, threaded=opts.codec == "copy")) as results:
                positions = range(prog.position, len(self.block))
                if workers > 1:  # a pooled result's bytes are reused once the next is asked for: take it first
                    for position, res in zip(positions, results):
                        self._take(writer, meter, position, res)
                else:
                    self._overlapped(writer, meter, zip(positions, results))
                if self.block and len(self.skipped) == len(self.block):
                    raise ValueError(f"every episode of {'this job' if 'job' in self.extra else 'the source'} "
                                     f"is bad ({len(self.skipped)} skipped, first: {self.skipped[0]['error']}); "
                                     f"no index was written to {target}: fix the source and re-run")
                writer.extra = dict(self.extra, **self.stats.write(target / STATS_NAME),  # before the index
                                    **({"skipped": self.skipped} if self.skipped else {}))
        finally:
            shutil.rmtree(spool, ignore_errors=True)
        self.saves.wait()  # the last shard's save waited for any before it; nothing may run past `finish`
        finish(target)
        return meter

    @contextlib.contextmanager
    def _last_save(self) -> Iterator[None]:
        """On the way out of a failed or interrupted write (the writer closed), save the last snapshot not saved,
        so a resume redoes no shard finished before it; the error raised stays the one that stopped the write."""
        try:
            yield
        except BaseException:
            try:
                self.saves.flush()
            except Exception as e:  # a full disk, say: the progress on disk stays the last one written whole
                log.info("%s: the last resume save failed too (%s); a resume redoes the shards finished after "
                            "the save before it", self.target, e)
            raise

    def _overlapped(self, writer: ShardWriter, meter: Meter, results: Iterator[tuple[int, tuple]]) -> None:
        """`_take` each result in a thread while this one encodes the next episode: with the encoder in this
        process, hashing and writing an episode (which release the GIL) would otherwise wait for its encoding
        and it for them. One episode ahead at most, taken in order; the thread's error is raised here."""
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="episodepipes-write") as ex:
            taking = None
            for position, res in results:
                if taking is not None:
                    taking.result()
                taking = ex.submit(self._take, writer, meter, position, res)
            if taking is not None:
                taking.result()

    def _take(self, writer: ShardWriter, meter: Meter, position: int, res: tuple) -> None:
        """Append the encoder's result for the episode at ``position`` of the block, or skip it if bad."""
        prog, opts = self.prog, self.opts
        self.position = position
        if res[0] == "bad":
            if not opts.skip_bad:
                raise EpisodeError(res[2])
            log.warning("skipping %s", res[2])
            self.skipped.append({"id": res[1], "error": res[2]})
            meter.update(0)
            return
        first, segs = (prog.frame, prog.segments) if position == prog.position else (0, None)
        with samples(res[2]) as (data, sizes):
            writer.add_frames(res[1], data, sizes, start=first, segments=segs)
        self.stats_log.add(res[1]["split"], *res[4])  # after the episode: `save` sees finished ones only
        self.origins[res[3]] += 1
        meter.update(len(sizes) - first)


def _check_copy(reader: EpisodeReader, opts: WriteOptions) -> None:
    """``codec="copy"`` takes a reader that copies packets, and only such a reader: one gives no frames to encode."""
    copies = getattr(reader, "copy", False) is True
    if opts.codec == "copy" and not copies:
        raise ValueError(f"codec='copy' needs a reader that copies video packets, and {reader!r} decodes frames; "
                         "make it with copy=True (LeRobotReader, RawReader), or use codec='av1' or 'h264'")
    if copies and opts.codec != "copy":
        raise ValueError(f"{reader!r} copies video packets, which codec={opts.codec!r} cannot take; pass "
                         "codec='copy', or make the reader with copy=False to decode and re-encode")
    if opts.codec == "copy" and opts.resize is not None:
        raise ValueError(f"resize={opts.resize} cannot apply to codec='copy', which keeps the source's packets "
                         "(and sizes); drop resize, or use codec='av1' to re-encode at that size")


def _check_unique(ids: list[str]) -> None:
    """Two source ids that become one tar-safe id would share member names: refuse before writing."""
    seen: dict[str, str] = {}
    for eid in ids:
        safe = safe_episode_id(eid)
        if safe in seen:
            raise ValueError(f"episodes {seen[safe]!r} and {eid!r} both become {safe!r} in shard member names; "
                             "rename one of them")
        seen[safe] = eid
