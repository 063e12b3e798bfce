"""`run_jobs`: ``write --num-jobs K`` as K Ray tasks on an existing Ray cluster, then ``merge`` (extra ``ray``).

Ray does what Ray does: it places each task on a node with ``cpus_per_job`` free CPUs, and runs a task again when
its worker or node dies (``max_retries``); the write it re-runs resumes from that job's own progress, so a retry
costs the shard in flight, never the job. An error of the write itself (bad input, a full disk) is not retried: it
would fail the same way; it is raised naming the job and its one-line message. Every task runs the same
``episodepipes-shard write`` command line a Slurm array task runs (in a child process of the Ray worker, so the
encoder processes and the write lock are the job's own), and OUT must be one folder every node and the driver see
(a shared filesystem), as for Slurm. The merge runs in the driver once every job ended well.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

log = logging.getLogger(__name__)


def _write_job(argv: list[str]) -> str:
    """One write job in a child process; its error line is raised so Ray reports it by job."""
    done = subprocess.run([sys.executable, "-m", "episodepipes.sharding.cli", *argv], capture_output=True, text=True)
    if done.returncode != 0:
        lines = [x for x in done.stderr.splitlines() if x.strip()]
        raise RuntimeError(lines[-1] if lines else f"exit status {done.returncode}")
    return done.stdout.strip().splitlines()[0] if done.stdout.strip() else ""


def finished_job(out: str | Path, i: int) -> bool:
    """Whether job ``i`` of a local OUT has its index (it is done; its write would refuse to run again)."""
    from episodepipes.format import INDEX_NAME
    from episodepipes.sharding.write.shards import job_dir

    return (job_dir(Path(out), i) / INDEX_NAME).is_file()


def run_jobs(src: str | Path, out: str | Path, num_jobs: int, write_args: Sequence[str] = (), *,
             address: str = "auto", cpus_per_job: float = 1.0, repack: bool = False, max_retries: int = 3,
             progress: Callable[[str], None] | None = None) -> dict:
    """Run ``write SRC OUT --num-jobs K --job-index I`` for I in 0..K-1 as Ray tasks, then merge OUT.

    Args:
        src: the source dataset, as every node sees it.
        out: the output folder, shared by every node and this driver.
        num_jobs: K.
        write_args: further ``write`` options, as command-line words.
        address: the Ray cluster (``"auto"``: ``RAY_ADDRESS`` or the local head; or ``host:port``,
            ``ray://host:port``); this function connects to it and never starts one.
        cpus_per_job: CPUs Ray reserves for each task (match ``--workers``).
        repack: merge byte-identical to one job (`merge_jobs`).
        max_retries: Ray's retries of a task whose worker or node died.
        progress: called with one line per finished job (the CLI prints them); None logs them.

    Returns:
        The merged index's JSON part.
    """
    try:
        import ray
    except ImportError:
        raise ImportError("the ray command needs Ray: pip install 'episodepipes[ray]'") from None
    from episodepipes.sharding.merge import merge_jobs

    say = progress or log.info
    connected = ray.is_initialized()
    if not connected:
        ray.init(address=address, log_to_driver=False)
    try:
        task = ray.remote(num_cpus=cpus_per_job, max_retries=max_retries, retry_exceptions=False)(_write_job)
        todo = [i for i in range(num_jobs) if not finished_job(out, i)]  # a re-run runs only the rest
        if len(todo) < num_jobs:
            say(f"{num_jobs - len(todo)} of {num_jobs} write jobs already finished; running the other {len(todo)}")
        refs = {task.remote(["write", str(src), str(out), *write_args, "--num-jobs", str(num_jobs),
                             "--job-index", str(i)]): i for i in todo}
        pending, failed = list(refs), []
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            i = refs[ready[0]]
            try:
                line = ray.get(ready[0])
            except ray.exceptions.RayTaskError as e:
                failed.append(i)
                say(f"write job {i} of {num_jobs} failed: {e.cause}")
                continue
            say(f"write job {i} done ({len(refs) - len(pending)}/{len(refs)}): {line}")
        if failed:
            raise ValueError(f"write jobs {sorted(failed)} of {num_jobs} failed (their errors above); fix the cause "
                             "and run the same command again: finished jobs are kept, unfinished ones resume")
    finally:
        if not connected:
            ray.shutdown()
    merged = merge_jobs(out, repack=repack)
    say(f"merged {num_jobs} jobs into {out}")
    return merged
