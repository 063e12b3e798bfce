"""``verify`` and ``stats --recompute`` split over K jobs (a Slurm array, Ray tasks), and their parts merged.

Job I of K checks the I-th contiguous block of shards (``verify``) or recomputes the statistics of the I-th block of
episodes (``stats --recompute``), and leaves its result in ``OUT/_parts/``: a JSON file naming the index it was made
from (its sha256), and for statistics a side file in the `episodepipes.normstats.sidefile` layout. ``--merge`` (one
job, after the K) reads the K parts in order, refusing a missing one or one made from another index by name: the
problems are listed together, and the statistics folded in episode order with the writer's own rule, so the index
rewritten equals a single ``stats --recompute``'s, byte for byte. The parts go once merged.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from episodepipes import safefile
from episodepipes.format import INDEX_NAME
from episodepipes.index import EpisodeIndex
from episodepipes.index.load import read_regular
from episodepipes.normstats import sidefile as statsfile
from episodepipes.normstats.fields import StatsFields
from episodepipes.sharding.recompute import recompute, rewrite_with_stats
from episodepipes.sharding.write.lock import write_lock
from episodepipes.sharding.write.plan import job_block

PARTS_DIR = "_parts"


def _name(kind: str, i: int, k: int) -> str:
    return f"{kind}-{i:04d}-of-{k:04d}"


def _save(out: Path, kind: str, i: int, k: int, index: EpisodeIndex, what: dict, blob: bytes | None = None) -> None:
    folder = safefile.make_dir(out / PARTS_DIR)
    files = [(folder / f"{_name(kind, i, k)}.bin", blob)] if blob is not None else []
    record = dict(what, index=index.fingerprint)
    safefile.write_files([*files, (folder / f"{_name(kind, i, k)}.json", json.dumps(record, sort_keys=True).encode())])


def _load(out: Path, kind: str, k: int, index: EpisodeIndex) -> list[dict[str, Any]]:
    """The K parts' records, in order, each checked to be of this index; every missing one named."""
    fix = f"run {kind} OUT --num-jobs {k} --job-index I for them (a Slurm array of {k})"
    missing = [i for i in range(k) if not (out / PARTS_DIR / f"{_name(kind, i, k)}.json").is_file()]
    if missing:
        raise ValueError(f"{out / PARTS_DIR}: {kind} parts {missing[:10]}{' and more' if len(missing) > 10 else ''} of "
                         f"{k} are missing; {fix}")
    records = []
    for i in range(k):
        file = out / PARTS_DIR / f"{_name(kind, i, k)}.json"
        try:
            rec = json.loads(read_regular(file, "run that part again", error=ValueError))
        except ValueError as e:
            raise ValueError(f"{file} is damaged ({e}); run part {i} again") from None
        if not isinstance(rec, dict) or rec.get("index") != index.fingerprint:
            raise ValueError(f"{file} was made from another {INDEX_NAME} than {out}'s (it changed since); run "
                             f"part {i} again")
        records.append(rec)
    return records


def _clear(out: Path, kind: str, k: int) -> None:
    for i in range(k):
        for ext in (".json", ".bin"):
            (out / PARTS_DIR / f"{_name(kind, i, k)}{ext}").unlink(missing_ok=True)
    if (out / PARTS_DIR).is_dir() and not any((out / PARTS_DIR).iterdir()):
        shutil.rmtree(out / PARTS_DIR)


def verify_part(out: Path, num_jobs: int, job_index: int) -> list[str]:
    """Verify job ``job_index``'s block of shards (`EpisodeIndex.problems`, tar members too); its problems are
    returned and kept as its part."""
    index = EpisodeIndex.open(out)
    block = job_block(len(index.shards), num_jobs=num_jobs, job_index=job_index)
    found = index.problems(block, members=True)
    _save(Path(out), "verify", job_index, num_jobs, index, {"shards": [block.start, block.stop], "problems": found})
    return found


def verify_merged(out: Path, num_jobs: int) -> list[str]:
    """Every problem the K verify parts found, in shard order (the parts go)."""
    out = Path(out)
    records = _load(out, "verify", num_jobs, EpisodeIndex.open(out))
    found: list[str] = []
    for rec in records:  # the index's own checks ran in every part: each line once
        found += [p for p in rec.get("problems", []) if isinstance(p, str) and p not in found]
    _clear(out, "verify", num_jobs)
    return found


def stats_part(out: Path, num_jobs: int, job_index: int) -> None:
    """Recompute the statistics of job ``job_index``'s block of episodes from the shards; kept as its part."""
    index = EpisodeIndex.open(out)
    data = index.data
    block = job_block(len(data["episodes"]), num_jobs=num_jobs, job_index=job_index)
    fields = recompute(Path(out), data["shards"], data["episodes"][block.start:block.stop])
    raw = fields.encode()
    _save(Path(out), "stats", job_index, num_jobs, index,
          {"episodes": [block.start, block.stop], "record": statsfile.descriptor(raw)[statsfile.FIELD]}, raw)


def stats_merged(out: Path, num_jobs: int) -> dict[str, Any]:
    """Fold the K statistics parts in episode order and rewrite the index with them (as ``stats --recompute``)."""
    out = Path(out)
    with write_lock(out):
        index = EpisodeIndex.open(out)
        fields = StatsFields()
        for i, rec in enumerate(_load(out, "stats", num_jobs, index)):
            file = out / PARTS_DIR / f"{_name('stats', i, num_jobs)}.bin"
            raw = read_regular(file, f"run part {i} again", error=ValueError)
            if statsfile.descriptor(raw)[statsfile.FIELD] != rec.get("record"):
                raise ValueError(f"{file} does not match its part record (size or sha256); run part {i} again")
            fields.add_loaded(*statsfile.decode(raw, where=str(file)))
        new = rewrite_with_stats(out, index, fields)
    _clear(out, "stats", num_jobs)
    return new
