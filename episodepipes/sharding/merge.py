"""`merge_jobs`: join the partial outputs of ``write --num-jobs K`` into one shard folder.

Each job cut its shards starting from its own first episode, so its last shard is short and
every later cut is shifted relative to a single-job run. Renaming job shards would therefore
give a valid dataset with different shard boundaries. Instead the merge re-packs the already
encoded samples (a byte copy, no decoding or encoding) through the same `ShardWriter` with the
same shard size, so the merged folder is **byte-identical** to a single-job run with the same
options: same shards, same sha256, same ``index.json``.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from episodepipes.format import INDEX_NAME
from episodepipes.index import EpisodeIndex
from episodepipes.sharding.lock import write_lock
from episodepipes.sharding.progress import JOBS_DIR, clear
from episodepipes.sharding.recompute import recompute
from episodepipes.sharding.writer import ShardWriter
from episodepipes.shardio import ByteSource, LocalSource
from episodepipes.statsfields import StatsFields, has_stats
from episodepipes.statsfile import NAME as STATS_NAME

log = logging.getLogger(__name__)


def _job_record(d: Path, data: dict) -> dict:
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


def _check_same_source(found: list[tuple[Path, dict]]) -> None:
    """Refuse jobs written from different sources: merged, they would duplicate some episodes and lose others."""
    d0, ref = found[0][0], found[0][1]["job"]
    owner: dict[str, str] = {}
    expected_first = 0
    for d, data in found:
        job = data["job"]
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
        written = {e.get("id") for e in data["episodes"]} | {s.get("id") for s in data.get("skipped", [])}
        if not written <= {*job["ids"]}:
            raise ValueError(f"job {d.name} holds episodes outside its recorded block "
                             f"({sorted(map(str, written - {*job['ids']}))[:3]}); re-run it with --overwrite")
    if expected_first != ref["episodes"]:
        raise ValueError(f"the jobs cover {expected_first} of {ref['episodes']} source episodes; re-run the "
                         "jobs with the same --num-jobs")


def _job_indexes(out: Path) -> list[tuple[Path, dict]]:
    jobs = out / JOBS_DIR
    dirs = sorted(p for p in jobs.glob("job-*") if p.is_dir()) if jobs.is_dir() else []
    if not dirs:
        raise FileNotFoundError(f"{jobs} holds no job outputs; run write --num-jobs K --job-index I first")
    found = []
    for d in dirs:
        file = d / INDEX_NAME
        if not file.exists():
            raise ValueError(f"job {d.name} is unfinished ({file} missing); re-run its write command to resume it")
        try:  # format, version and every shard's sha256: a damaged job shard must not be copied into OUT
            data = EpisodeIndex.open(d, verify=True).data
        except (ValueError, FileNotFoundError) as e:
            raise ValueError(f"job {d.name}: {e}; re-run that job with --overwrite") from e
        _job_record(d, data)
        found.append((d, data))
    num_jobs = found[0][1]["job"]["num_jobs"]
    indices = [data["job"]["index"] for _, data in found]
    if indices != list(range(num_jobs)):
        missing = sorted(set(range(num_jobs)) - set(indices))
        if not missing:
            raise ValueError(f"{jobs}: the job folders {[d.name for d, _ in found]} do not hold jobs 0..{num_jobs - 1} "
                             f"of {num_jobs}; re-run the jobs with the same --num-jobs and --overwrite")
        raise ValueError(f"{jobs}: jobs {missing} of {num_jobs} are missing; run them with --job-index")
    for d, data in found:
        if data["options"] != found[0][1]["options"] or data["job"]["num_jobs"] != num_jobs:
            raise ValueError(f"job {d.name} was written with other options than {found[0][0].name}; "
                             "re-run it with the same options and --overwrite")
    _check_same_source(found)
    return found


def merge_jobs(out: str | Path, *, overwrite: bool = False) -> dict:
    """Merge ``out/_jobs/job-*`` into ``out``; returns the merged index data. Job outputs are removed after.

    Every job must come from the same source: the same episode list, options and job count (each job
    records its episode ids and a source fingerprint); a job from another source is refused by name.

    Args:
        out: the OUT of the ``write --num-jobs K --job-index I`` runs.
        overwrite: merge again over an already merged ``out``.
    """
    out = Path(out)
    if (out / INDEX_NAME).exists() and not overwrite:
        raise FileExistsError(f"{out / INDEX_NAME} exists: already merged; pass --overwrite to merge again")
    if not (out / JOBS_DIR).is_dir():
        raise FileNotFoundError(f"{out / JOBS_DIR} does not exist; run write --num-jobs K --job-index I "
                                "into this OUT first")
    with write_lock(out):
        jobs = _job_indexes(out)
        clear(out, jobs=False)
        options = jobs[0][1]["options"]
        size = options.get("shard_size") if isinstance(options, dict) else None
        if type(size) is not int or size < 1:
            raise ValueError(f"job {jobs[0][0].name}: options.shard_size={size!r} is not a positive integer; "
                             "re-run that job with --overwrite")
        skipped = [s for _, data in jobs for s in data.get("skipped", [])]
        extra = dict(_job_stats(jobs).write(out / STATS_NAME), **({"skipped": skipped} if skipped else {}))
        with ShardWriter(out, shard_size=size, options=options, extra=extra) as writer:
            for d, data in jobs:
                with LocalSource(d) as job:
                    for entry in data["episodes"]:
                        meta = {k: v for k, v in entry.items() if k != "segments"}
                        writer.add_frames(meta, *_frames(job, data["shards"], entry["segments"]))
        shutil.rmtree(out / JOBS_DIR)
    log.info("merged %d jobs into %s", len(jobs), out)
    return json.loads((out / INDEX_NAME).read_text())


def _job_stats(jobs: list[tuple[Path, dict]]) -> StatsFields:
    """The jobs' statistics folded in job order, as a single job folds its episodes: the same fields."""
    out = StatsFields()
    for d, data in jobs:
        if not has_stats(data):  # a job written by an older episodepipes: read its arrays back
            data = recompute(d, data["shards"], data["episodes"]).to_json()
        out.add_fields(data, where=f"job {d.name}: {d / INDEX_NAME}", root=d)
    return out


def _frames(job: ByteSource, shards: list[dict], segments: list[dict]) -> tuple[bytes, list[int]]:
    """The tar bytes of one episode's frames, read from a job's shards, and each frame's size."""
    blobs: list[bytes] = []
    sizes: list[int] = []
    for seg in segments:
        start = seg["offsets"][0]
        blobs.append(job.read(shards[seg["shard"]]["name"], start, seg["end"] - start))
        bounds = seg["offsets"] + [seg["end"]]
        sizes += [b - a for a, b in zip(bounds, bounds[1:])]
    return b"".join(blobs), sizes
