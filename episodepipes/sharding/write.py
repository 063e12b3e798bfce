"""`write_shards`: a reader's episodes to a finished, resumable, deterministic shard folder.

Episodes are encoded in ``workers`` processes (an ordered ``imap``, so output order never
depends on timing) and appended by one writer in the parent, which is what makes the bytes
independent of ``workers``. With ``num_jobs > 1`` this job writes its contiguous block of the
sorted episode list into ``out/_jobs/job-NNNN/``; `episodepipes.sharding.merge` joins them.
"""

from __future__ import annotations

import logging
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from episodepipes.format import INDEX_NAME, safe_episode_id
from episodepipes.sharding.encode import EncodeOptions
from episodepipes.sharding.episode import EpisodeError, EpisodeReader
from episodepipes.sharding.plan import assign_splits, job_block
from episodepipes.sharding.pool import encoded, samples
from episodepipes.sharding.progress import JOBS_DIR, PROGRESS_NAME, Progress, start
from episodepipes.sharding.writer import ShardWriter

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class WriteOptions:
    """What decides the output bytes (recorded in the index and checked on resume), plus ``skip_bad``.

    ``skip_bad`` is left out of `to_dict`: it changes nothing unless an episode is bad, and then the
    index's ``skipped`` list records it. So a run that stopped at a bad episode can resume with it.
    """

    format: str
    shard_size: int = 512 * 10**6
    jpeg_quality: int = 90
    resize: tuple[int, int] | None = None
    val_fraction: float | None = None
    val_episodes: tuple[str, ...] | None = None
    seed: int = 0
    skip_bad: bool = False

    def to_dict(self) -> dict:
        d = asdict(self)
        del d["skip_bad"]
        d["resize"] = list(self.resize) if self.resize else None
        d["val_episodes"] = list(self.val_episodes) if self.val_episodes is not None else None
        return d


@dataclass(frozen=True)
class WriteResult:
    out: Path
    episodes: int
    frames: int
    shards: int
    skipped: list[dict]
    resumed: bool


def job_dir(out: Path, job_index: int) -> Path:
    return out / JOBS_DIR / f"job-{job_index:04d}"


def write_shards(reader: EpisodeReader, out: str | Path, opts: WriteOptions, *, workers: int = 1,
                 num_jobs: int = 1, job_index: int = 0, overwrite: bool = False,
                 progress_bar: bool = False) -> WriteResult:
    """Shard ``reader`` into ``out``, resuming an interrupted run with the same options."""
    out = Path(out)
    ids = reader.episode_ids()
    if not ids:
        raise ValueError(f"the source has no episodes ({reader!r}); check SRC and --format")
    _check_unique(ids)
    splits = assign_splits(ids, val_fraction=opts.val_fraction, val_episodes=opts.val_episodes, seed=opts.seed)
    block = list(job_block(len(ids), num_jobs=num_jobs, job_index=job_index))
    options = opts.to_dict()
    target = out if num_jobs == 1 else job_dir(out, job_index)
    state = dict(options, num_jobs=num_jobs, job_index=job_index) if num_jobs > 1 else options
    prog, resumed = start(target, state, overwrite=overwrite,
                          finished_hint=out / INDEX_NAME if num_jobs > 1 else None)
    if prog.skipped and not opts.skip_bad:
        raise ValueError(f"the interrupted run in {target} skipped {[x['id'] for x in prog.skipped]}; "
                         "resume with --skip-bad, or pass --overwrite to start over")
    enc_opts = EncodeOptions(jpeg_quality=opts.jpeg_quality, resize=opts.resize)
    spool = target / "_spool"
    shutil.rmtree(spool, ignore_errors=True)  # left by a killed run
    if workers > 1:
        spool.mkdir()
    tasks = [(reader, ids[p], splits[ids[p]], enc_opts, str(spool) if workers > 1 else None)
             for p in block[prog.position:]]
    skipped = list(prog.skipped)
    position = prog.position  # relative to the block; read by `save` when a shard finishes

    def save(w: ShardWriter) -> None:
        # no episode in flight happens only at the final flush: every episode has been added
        pend = w.pending or {"segments": [], "frame": 0}
        Progress(options=state, shards=w.shards, episodes=w.episodes, skipped=skipped,
                 position=position if w.pending else len(block), frame=pend["frame"],
                 segments=pend["segments"]).save(target)

    frames, t0 = 0, time.perf_counter()
    with ShardWriter(target, shard_size=opts.shard_size, options=options, shards=prog.shards,
                     episodes=prog.episodes, on_shard=save) as writer, \
            _bar(len(block), prog.position, enabled=progress_bar) as bar:
        for position, res in zip(range(prog.position, len(block)), encoded(tasks, workers)):
            if res[0] == "bad":
                if not opts.skip_bad:
                    raise EpisodeError(res[2])
                log.warning("skipping %s", res[2])
                skipped.append({"id": res[1], "error": res[2]})
            else:
                first, segs = (prog.frame, prog.segments) if position == prog.position else (0, None)
                with samples(res[2]) as (data, sizes):
                    writer.add_frames(res[1], data, sizes, start=first, segments=segs)
                frames += len(sizes) - first
            bar.update(1)
            bar.set_postfix_str(f"{frames / max(time.perf_counter() - t0, 1e-9):.0f} frames/s", refresh=False)
        extra: dict = {"skipped": skipped} if skipped else {}
        if num_jobs > 1:
            extra["job"] = {"index": job_index, "num_jobs": num_jobs, "episodes": len(ids),
                            "first": block[0] if block else 0, "count": len(block)}
        writer.extra = extra
    shutil.rmtree(spool, ignore_errors=True)
    (target / PROGRESS_NAME).unlink(missing_ok=True)
    total = sum(e["length"] for e in writer.episodes)
    return WriteResult(target, len(writer.episodes), total, len(writer.shards), skipped, resumed)


def _check_unique(ids: list[str]) -> None:
    """Two source ids that become one tar-safe id would share member names: refuse before writing."""
    seen: dict[str, str] = {}
    for eid in ids:
        safe = safe_episode_id(eid)
        if safe in seen:
            raise ValueError(f"episodes {seen[safe]!r} and {eid!r} both become {safe!r} in shard member names; "
                             "rename one of them")
        seen[safe] = eid


def _bar(total: int, initial: int, *, enabled: bool):  # noqa: ANN202 - a tqdm or a no-op stand-in
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, unit="ep", desc="episodes", file=sys.stderr,
                disable=None if enabled else True, dynamic_ncols=True)
