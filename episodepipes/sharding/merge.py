"""`merge_jobs`: join the partial outputs of ``write --num-jobs K`` into one shard folder.

Each job cut its shards starting from its own first episode, so its last shard is short and every later cut is
shifted relative to a single-job run. The default merge (`episodepipes.sharding.adopt`) keeps those cuts: it renames
the jobs' shards into OUT and joins their index columns, moving no byte, which is what a 10^8-frame merge can afford.
``repack=True`` re-packs the already encoded samples (a byte copy, no decoding or encoding) through the same
`ShardWriter` with the same shard size, so the merged folder is **byte-identical** to a single-job run with the same
options: same shards, same sha256, same ``index.json``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import zlib
from pathlib import Path

from episodepipes.format import INDEX_NAME
from episodepipes.index import EpisodeIndex
from episodepipes.index.load import MAX_INDEX_BYTES, read_regular
from episodepipes.normstats.fields import StatsFields, has_stats
from episodepipes.normstats.sidefile import NAME as STATS_NAME
from episodepipes.sharding.adopt import JOURNAL, adopt
from episodepipes.sharding.recompute import recompute
from episodepipes.sharding.write import DiskFullError
from episodepipes.sharding.write.lock import write_lock
from episodepipes.sharding.write.progress import JOBS_DIR, clear
from episodepipes.sharding.write.remote_out import RemoteOut, clear_staging, written
from episodepipes.sharding.write.writer import ShardWriter
from episodepipes.shardio import ByteSource, is_url, open_source

log = logging.getLogger(__name__)


def _job_record(d: _Job, data: dict) -> dict:
    """The ``job`` field of a job's index, checked: what the job covered and from which source."""
    job = data.get("job")
    ints = ("index", "num_jobs", "episodes", "first", "count")
    if not isinstance(job, dict) or any(type(job.get(k)) is not int or job[k] < 0 for k in ints):
        raise ValueError(f"job {d.name}: {d / INDEX_NAME} has no valid 'job' record (it is not the output of "
                         "write --num-jobs K --job-index I); re-run that job with --overwrite")
    ids, source = job.get("ids"), job.get("source")
    if not isinstance(source, str) or not isinstance(ids, list) or len(ids) != job["count"] \
            or not all(isinstance(i, str) for i in ids):
        raise ValueError(f"job {d.name}: {d / INDEX_NAME} does not record its episode ids and source fingerprint "
                         "(written by an older episodepipes?); re-run that job with --overwrite")
    return job


def _check_same_source(found: list[tuple[_Job, EpisodeIndex]]) -> None:
    """Refuse jobs written from different sources: merged, they would duplicate some episodes and lose others."""
    d0, ref = found[0][0], found[0][1].meta["job"]
    owner: dict[str, str] = {}
    expected_first = 0
    for d, data in found:
        job = data.meta["job"]
        if job["source"] != ref["source"] or job["episodes"] != ref["episodes"]:
            what = (f"{job['episodes']} source episodes vs {ref['episodes']}" if job["episodes"] != ref["episodes"]
                    else "same episode count, different episode ids or options")
            raise ValueError(f"job {d.name} was written from another source than {d0.name} ({what}); "
                             "re-run it from the same SRC and options with --overwrite")
        if job["first"] != expected_first:
            raise ValueError(f"job {d.name} starts at episode {job['first']}, but the jobs before it end at "
                             f"{expected_first}; re-run it with --overwrite")
        expected_first += job["count"]
        for eid in job["ids"]:
            if eid in owner:
                raise ValueError(f"episode {eid!r} is in job {owner[eid]} and job {d.name}; re-run {d.name} "
                                 "with --overwrite")
            owner[eid] = d.name
        written = {*data.ids} | {s.get("id") for s in data.meta.get("skipped", [])}
        if not written <= {*job["ids"]}:
            raise ValueError(f"job {d.name} holds episodes outside its recorded block "
                             f"({sorted(map(str, written - {*job['ids']}))[:3]}); re-run it with --overwrite")
    if expected_first != ref["episodes"]:
        raise ValueError(f"the jobs cover {expected_first} of {ref['episodes']} source episodes; re-run the "
                         "jobs with the same --num-jobs")


class _Job:
    """A job output: its folder name (``job-NNNN``) and root (a local folder or a URL)."""

    def __init__(self, name: str, root: Path | str, finished: bool) -> None:
        self.name, self.root, self.finished = name, root, finished

    def __truediv__(self, file: str) -> str:  # where a job's file is, for messages
        return f"{self.root}/{file}"


def _local_jobs(out: Path) -> list[_Job]:
    jobs = out / JOBS_DIR
    dirs = sorted(p for p in jobs.glob("job-*") if p.is_dir()) if jobs.is_dir() else []
    return [_Job(d.name, d, (d / INDEX_NAME).exists()) for d in dirs]


def _job_indexes(jobs: str, dirs: list[_Job], *, verify: bool = True) -> list[tuple[_Job, EpisodeIndex]]:
    """Every job's index, checked (``verify``: every local shard's sha256 too), and the jobs against each other."""
    if not dirs:
        raise FileNotFoundError(f"{jobs} holds no job outputs; run write --num-jobs K --job-index I first")
    found = []
    for d in dirs:
        file = d / INDEX_NAME
        if not d.finished:
            raise ValueError(f"job {d.name} is unfinished ({file} missing); re-run its write command to resume it")
        try:  # format, version and every shard's sha256 (a remote job: every frame's crc32, as it is copied)
            index = EpisodeIndex.open(d.root, verify=verify and not isinstance(d.root, str))
            if isinstance(d.root, str) and not index.has_crc:
                index.verify()
            data = index.meta
        except (ValueError, FileNotFoundError) as e:
            raise ValueError(f"job {d.name}: {e}; re-run that job with --overwrite") from e
        _job_record(d, data)
        try:  # read its statistics and count them against its episodes (verify=True did for a local job)
            if has_stats(data):
                index.load_stats()
        except ValueError as e:
            raise ValueError(f"job {d.name}: {e}; re-run that job with --overwrite") from None
        found.append((d, index))
    num_jobs = found[0][1].meta["job"]["num_jobs"]
    indices = [index.meta["job"]["index"] for _, index in found]
    if num_jobs != len(found) or indices != list(range(num_jobs)):
        have = set(indices)  # num_jobs is a job's field: list the first missing ones, never count up to it
        missing = [i for i in range(min(num_jobs, len(found) + 10)) if i not in have]
        if not missing:
            raise ValueError(f"{jobs}: the job folders {[d.name for d, _ in found]} do not hold jobs 0..{num_jobs - 1} "
                             f"of {num_jobs}; re-run the jobs with the same --num-jobs and --overwrite")
        more = " and more" if num_jobs > len(found) + 10 else ""
        raise ValueError(f"{jobs}: jobs {missing}{more} of {num_jobs} are missing; run them with --job-index")
    for d, index in found:
        if index.options != found[0][1].options or index.meta["job"]["num_jobs"] != num_jobs:
            raise ValueError(f"job {d.name} was written with other options than {found[0][0].name}; "
                             "re-run it with the same options and --overwrite")
    _check_same_source(found)
    return found


def merge_jobs(out: str | Path, *, overwrite: bool = False, staging: str | Path | None = None,
               repack: bool = False) -> dict:
    """Merge ``out/_jobs/job-*`` into ``out``; returns the merged index data. Job outputs are removed after.

    Every job must come from the same source: the same episode list, options and job count (each job
    records its episode ids and a source fingerprint); a job from another source is refused by name.

    By default a local OUT adopts the jobs' shards in place (`episodepipes.sharding.adopt`: renamed, no byte
    copied, each shard's size checked against its job's index; an interrupted merge finishes when re-run): the
    same episodes and frames as one job, with shards cut where each job cut them. ``repack`` copies every frame
    into shards cut as one job cuts them (every shard's sha256 checked first): byte-identical to a single-job
    write. A remote OUT is always repacked (an object store has no rename).

    Args:
        out: the OUT of the ``write --num-jobs K --job-index I`` runs: a folder, or a remote root whose jobs
            wrote ``OUT/_jobs/job-NNNN`` there (merged through a staging folder, shards uploaded as they
            finish, the index last, then the remote job outputs deleted).
        overwrite: merge again over an already merged ``out``.
        staging: a remote ``out`` only: where its staging folder goes (see `write_shards`).
        repack: copy the frames into a single job's shard cuts (byte-identical to one job) instead of renaming.
    """
    if is_url(out):
        return merge_remote(str(out), overwrite=overwrite, staging=staging)
    out = Path(out)
    if (out / INDEX_NAME).exists() and (out / JOURNAL).exists():  # an in-place merge killed after its index
        with write_lock(out):
            shutil.rmtree(out / JOBS_DIR, ignore_errors=True)
            (out / JOURNAL).unlink(missing_ok=True)
        return json.loads((out / INDEX_NAME).read_text())
    if (out / INDEX_NAME).exists() and not overwrite:
        raise FileExistsError(f"{out / INDEX_NAME} exists: already merged; pass --overwrite to merge again")
    if not (out / JOBS_DIR).is_dir():
        raise FileNotFoundError(f"{out / JOBS_DIR} does not exist; run write --num-jobs K --job-index I "
                                "into this OUT first")
    with write_lock(out):
        journaled = (out / JOURNAL).exists()
        if journaled and repack:
            raise ValueError(f"{out / JOURNAL} records an interrupted in-place merge, which moved job shards into "
                             f"{out}; finish it with merge (without --repack)")
        jobs = _job_indexes(str(out / JOBS_DIR), _local_jobs(out), verify=repack)
        if not journaled:
            clear(out, jobs=False)
        try:
            if not repack:
                adopt(out, jobs, _skipped(jobs), write_stats=lambda: _job_stats(jobs).write(out / STATS_NAME))
                log.info("merged %d jobs into %s in place", len(jobs), out)
                return json.loads((out / INDEX_NAME).read_text())
            with ShardWriter(out, **writer_options(jobs, out)) as writer:
                copy_jobs(jobs, writer)
        except OSError as e:
            if e.errno not in DiskFullError.ERRNOS:
                raise
            where = f": {e.filename}" if e.filename else ""
            raise DiskFullError(f"{out}: the disk is full ({e.strerror}{where}) during merge; the job outputs are "
                                "kept: free space (or move OUT) and re-run the same merge") from e
        shutil.rmtree(out / JOBS_DIR)
    log.info("merged %d jobs into %s", len(jobs), out)
    return json.loads((out / INDEX_NAME).read_text())


def writer_options(jobs: list[tuple[_Job, EpisodeIndex]], out: Path) -> dict:
    """`ShardWriter` keywords of the merged output: the jobs' shard size, options and folded statistics.

    The statistics side file is written into ``out`` (the local folder the writer writes) here, before the index.
    """
    options = jobs[0][1].options
    size = options.get("shard_size") if isinstance(options, dict) else None
    if type(size) is not int or size < 1:
        raise ValueError(f"job {jobs[0][0].name}: options.shard_size={size!r} is not a positive integer; "
                         "re-run that job with --overwrite")
    extra = dict(_job_stats(jobs).write(out / STATS_NAME), **_skipped(jobs))
    return {"shard_size": size, "options": options, "extra": extra}


def _skipped(jobs: list[tuple[_Job, EpisodeIndex]]) -> dict:
    skipped = [s for _, index in jobs for s in index.meta.get("skipped", [])]
    return {"skipped": skipped} if skipped else {}


def copy_jobs(jobs: list[tuple[_Job, EpisodeIndex]], writer: ShardWriter) -> None:
    """Every job's episodes, in job order, appended to ``writer`` (the encoded bytes, copied)."""
    for d, index in jobs:
        data = index.data
        with open_source(d.root) as job:
            for entry in data["episodes"]:
                meta = {k: v for k, v in entry.items() if k != "segments"}
                frames = _frames(d, job, data["shards"], entry)
                try:  # the bytes a job's index points at, re-parsed by the writer (a packed episode's chunks)
                    writer.add_frames(meta, *frames)
                except ValueError as e:
                    raise ValueError(f"job {d.name}: {d / INDEX_NAME}: {e}; re-run that job with --overwrite") from None


def _job_stats(jobs: list[tuple[_Job, EpisodeIndex]]) -> StatsFields:
    """The jobs' statistics folded in job order, as a single job folds its episodes: the same fields."""
    out = StatsFields()
    for d, index in jobs:
        data = index.meta
        if not has_stats(data):  # a job written by an older episodepipes: read its arrays back
            if isinstance(d.root, str):
                raise ValueError(f"job {d.name}: {d / INDEX_NAME} has no statistics (an older episodepipes); "
                                 "re-run that job with --overwrite")
            data = recompute(d.root, index.data["shards"], index.data["episodes"]).to_json()
        out.add_fields(data, where=f"job {d.name}: {d / INDEX_NAME}", read_side=_side_file(d),
                       side=d / STATS_NAME)
    return out


def _side_file(d: _Job):  # noqa: ANN202 - a reader of the job's statistics side file
    if isinstance(d.root, str):
        def read() -> bytes:
            with open_source(d.root) as src:
                return src.read_file(STATS_NAME, limit=MAX_INDEX_BYTES)
        return read
    return lambda: read_regular(d.root / STATS_NAME, "re-run that job with --overwrite", error=ValueError)


def _frames(d: _Job, job: ByteSource, shards: list[dict], entry: dict) -> tuple[bytes, list[int]]:
    """The tar bytes of one episode's frames, read from a job's shards (crc32-checked), and each frame's size."""
    blobs: list[bytes] = []
    sizes: list[int] = []
    for seg in entry["segments"]:
        start = seg["offsets"][0]
        name = shards[seg["shard"]]["name"]
        data = job.read(name, start, seg["end"] - start)
        bounds = seg["offsets"] + [seg["end"]]
        for k, (a, b, crc) in enumerate(zip(bounds, bounds[1:], seg.get("crc32") or [None] * seg["count"])):
            # a packed frame's crc32 covers its record, which sits `heads[k]` into its span
            lo = a + seg["heads"][k] if "heads" in seg else a
            hi = lo + seg["sizes"][k] if "heads" in seg else b
            if crc is not None and zlib.crc32(memoryview(data)[lo - start:hi - start]) != crc:
                raise ValueError(f"job {d.name}: {d / name} episode {entry['id']!r} frame {seg['first'] + k} fails "
                                 "its crc32; re-run that job with --overwrite")
            sizes.append(b - a)
        blobs.append(data)
    return b"".join(blobs), sizes


# ---------------------------------------------------------------- remote OUT
# `merge` on a remote OUT: the jobs wrote ``OUT/_jobs/job-NNNN`` in the object store, and are merged from there.
#
# Jobs of a multi-machine run share no disk, so their outputs live under the remote OUT (each written
# through its own staging folder, `episodepipes.sharding.write.remote_out`). The merge reads every job's index
# and frames by byte range (each frame checked against its crc32 as it is copied), re-packs them through
# a `ShardWriter` in a local staging folder exactly as a local merge does (so the merged objects are
# byte-identical to a single-job write), uploads each merged shard as it finishes, the index last, and
# only then deletes the job outputs. An interrupted merge leaves the jobs in place: re-run it.

_JOB = re.compile(rf"{JOBS_DIR}/(job-[0-9]{{4}})/.+")


def merge_remote(url: str, *, overwrite: bool = False, staging: str | os.PathLike | None = None) -> dict:
    """Merge ``url/_jobs/job-*`` into ``url``; returns the merged index data. See `merge_jobs`."""
    out = RemoteOut(url, staging)
    target = out.staging
    target.mkdir(parents=True, exist_ok=True)
    with write_lock(target):
        top = out.store(target)
        names = top.names()
        if INDEX_NAME in names and not overwrite:
            raise FileExistsError(f"{out.url}/{INDEX_NAME} exists: already merged; pass --overwrite to merge again")
        found = sorted({m.group(1) for n in names if (m := _JOB.fullmatch(n))})
        if not found:
            raise FileNotFoundError(f"{out.url}/{JOBS_DIR} holds no job outputs; run write --num-jobs K "
                                    "--job-index I into this OUT first")
        dirs = [_Job(j, f"{out.url}/{JOBS_DIR}/{j}", f"{JOBS_DIR}/{j}/{INDEX_NAME}" in names) for j in found]
        jobs = _job_indexes(f"{out.url}/{JOBS_DIR}", dirs)
        top.delete(written(names, jobs=False))  # an earlier or interrupted merge's objects; the jobs stay
        clear_staging(target)
        with ShardWriter(target, **writer_options(jobs, target),
                         on_shard=lambda w: out.shard_done(target, w.shards[-1], progress=False)) as writer:
            copy_jobs(jobs, writer)
        raw = out.finish(target)
        top.delete([n for n in names if n.startswith(f"{JOBS_DIR}/")])
    log.info("merged %d jobs into %s", len(jobs), out.url)
    return json.loads(raw)
