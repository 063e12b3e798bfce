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
from episodepipes.sharding.progress import JOBS_DIR, clear
from episodepipes.sharding.writer import ShardWriter

log = logging.getLogger(__name__)


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
        found.append((d, data))
    num_jobs = found[0][1]["job"]["num_jobs"]
    indices = [data["job"]["index"] for _, data in found]
    if indices != list(range(num_jobs)):
        missing = sorted(set(range(num_jobs)) - set(indices))
        raise ValueError(f"{jobs}: jobs {missing} of {num_jobs} are missing; run them with --job-index")
    for d, data in found:
        if data["options"] != found[0][1]["options"] or data["job"]["num_jobs"] != num_jobs:
            raise ValueError(f"job {d.name} was written with other options than {found[0][0].name}; "
                             "re-run it with the same options and --overwrite")
    return found


def merge_jobs(out: str | Path, *, overwrite: bool = False) -> dict:
    """Merge ``out/_jobs/job-*`` into ``out``; returns the merged index data. Job outputs are removed after."""
    out = Path(out)
    if (out / INDEX_NAME).exists() and not overwrite:
        raise FileExistsError(f"{out / INDEX_NAME} exists: already merged; pass --overwrite to merge again")
    jobs = _job_indexes(out)
    clear(out, jobs=False)
    options = jobs[0][1]["options"]
    skipped = [s for _, data in jobs for s in data.get("skipped", [])]
    with ShardWriter(out, shard_size=options["shard_size"], options=options,
                     extra={"skipped": skipped} if skipped else {}) as writer:
        for d, data in jobs:
            for entry in data["episodes"]:
                meta = {k: v for k, v in entry.items() if k != "segments"}
                writer.add_frames(meta, *_frames(d, data["shards"], entry["segments"]))
    shutil.rmtree(out / JOBS_DIR)
    log.info("merged %d jobs into %s", len(jobs), out)
    return json.loads((out / INDEX_NAME).read_text())


def _frames(d: Path, shards: list[dict], segments: list[dict]) -> tuple[bytes, list[int]]:
    """The tar bytes of one episode's frames, read from a job's shards, and each frame's size."""
    blobs: list[bytes] = []
    sizes: list[int] = []
    for seg in segments:
        with open(d / shards[seg["shard"]]["name"], "rb") as f:
            f.seek(seg["offsets"][0])
            blobs.append(f.read(seg["end"] - seg["offsets"][0]))
        bounds = seg["offsets"] + [seg["end"]]
        sizes += [b - a for a, b in zip(bounds, bounds[1:])]
    return b"".join(blobs), sizes
