"""`merge` on a remote OUT: the jobs wrote ``OUT/_jobs/job-NNNN`` in the object store, and are merged from there.

Jobs of a multi-machine run share no disk, so their outputs live under the remote OUT (each written
through its own staging folder, `episodepipes.sharding.write.remote_out`). The merge reads every job's index
and frames by byte range (each frame checked against its crc32 as it is copied), re-packs them through
a `ShardWriter` in a local staging folder exactly as a local merge does (so the merged objects are
byte-identical to a single-job write), uploads each merged shard as it finishes, the index last, and
only then deletes the job outputs. An interrupted merge leaves the jobs in place: re-run it.
"""

from __future__ import annotations

import json
import logging
import os
import re

from episodepipes.format import INDEX_NAME
from episodepipes.sharding.merge import _Job, _job_indexes, copy_jobs, writer_options
from episodepipes.sharding.write.lock import write_lock
from episodepipes.sharding.write.progress import JOBS_DIR
from episodepipes.sharding.write.remote_out import RemoteOut, clear_staging, written
from episodepipes.sharding.write.writer import ShardWriter

log = logging.getLogger(__name__)
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
