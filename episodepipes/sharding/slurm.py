"""Slurm job arrays as the multi-job path: the task's job index from its environment, and the script a user submits.

Under ``sbatch --array``, Slurm gives every task ``SLURM_ARRAY_TASK_ID`` and the array's ``SLURM_ARRAY_TASK_COUNT``,
``SLURM_ARRAY_TASK_MIN`` and ``SLURM_ARRAY_TASK_MAX``. A command with ``--num-jobs K`` and no ``--job-index`` takes
``TASK_ID - TASK_MIN`` as its index (so ``--array=0-3`` and ``--array=1-4`` both run jobs 0..3), and refuses an array
that is not K consecutive ids: a wrong K would write blocks that never merge, or two tasks one block. An explicit
``--job-index`` wins over the environment (a job re-run by hand inside some allocation).

`submit_script` prints what to submit: a K-task array of ``write`` and a ``merge`` that Slurm starts only when every
task ended well (``--dependency=afterok``). Scheduling, placement, requeueing and logs stay Slurm's; an interrupted
task resumes from its own progress when Slurm (or the user) runs it again.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Mapping, Sequence

ARRAY_VARS = ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_MAX")


def array_task(env: Mapping[str, str]) -> tuple[int, int, int, int] | None:
    """(task id, count, min, max) of a Slurm array task, or None outside an array; a value that is not an integer
    is refused naming the variable."""
    if "SLURM_ARRAY_TASK_ID" not in env:
        return None
    values = []
    for name in ARRAY_VARS:
        text = env.get(name)
        if text is None or not text.strip().isdigit():
            raise ValueError(f"{name}={text!r} is not a task number although SLURM_ARRAY_TASK_ID is set; run under "
                             "sbatch --array, or pass --job-index")
        values.append(int(text))
    return values[0], values[1], values[2], values[3]


def job_index(num_jobs: int, given: int | None, env: Mapping[str, str]) -> int:
    """This command's job index: ``given`` when the user passed ``--job-index``, else the Slurm array task's place
    in its array, else 0 (as ``--job-index`` defaulted to before)."""
    if given is not None:
        return given
    task = array_task(env)
    if task is None:  # as before Slurm arrays: job 0
        return 0
    tid, count, low, high = task
    if count != num_jobs:
        raise ValueError(f"this Slurm array has SLURM_ARRAY_TASK_COUNT={count} tasks but --num-jobs is {num_jobs}; "
                         f"submit --array=0-{num_jobs - 1} (or pass --num-jobs {count})")
    if high - low + 1 != count:
        raise ValueError(f"this Slurm array's ids run {low}..{high} with gaps or a step ({count} tasks); submit "
                         f"consecutive ids, --array=0-{num_jobs - 1}")
    if not low <= tid <= high:
        raise ValueError(f"SLURM_ARRAY_TASK_ID={tid} is outside its array {low}..{high}; run under sbatch --array, "
                         "or pass --job-index")
    return tid - low


def submit_script(src: str, out: str, num_jobs: int, write_args: Sequence[str], *,
                  sbatch_args: Sequence[str] = (), merge_args: Sequence[str] = (),
                  python: str | None = None, name: str = "episodepipes") -> str:
    """A bash script that submits ``write SRC OUT --num-jobs K`` as a K-task array, then ``merge OUT`` after it.

    Args:
        src: the source dataset, as every task sees it.
        out: the shared output folder.
        num_jobs: K, the array's size.
        write_args: further ``write`` options, as command-line words (``--shard-size 1GB``).
        sbatch_args: ``sbatch`` options for both submissions (``--partition=cpu``, ``--time=4:00:00``).
        merge_args: further ``merge`` options (``--repack``).
        python: the interpreter the jobs run; None for this one (the same environment and episodepipes).
        name: the Slurm job name prefix.
    """
    py = shlex.quote(python or sys.executable)
    cli = f"{py} -m episodepipes.sharding.cli"
    q = shlex.join
    write = f"{cli} write {q([src, out])} --num-jobs {num_jobs}" + "".join(f" {shlex.quote(w)}" for w in write_args)
    merge = f"{cli} merge {q([out, *merge_args])}"
    extra = "".join(f" {shlex.quote(w)}" for w in sbatch_args)
    return "\n".join([
        "#!/bin/bash",
        f"# {num_jobs} write jobs as one Slurm array, then merge once they all ended well (afterok).",
        "# Each task takes its job index from SLURM_ARRAY_TASK_ID; a failed task resumes when re-run",
        "# (scontrol requeue, or sbatch the same array again); logs go to slurm-<job>_<task>.out.",
        "set -euo pipefail",
        f"array=$(sbatch --parsable --job-name={shlex.quote(name + '-write')} --array=0-{num_jobs - 1}{extra} "
        f"--wrap={shlex.quote(write)})",
        f"merge=$(sbatch --parsable --job-name={shlex.quote(name + '-merge')} --dependency=afterok:\"$array\" "
        f"--kill-on-invalid-dep=yes{extra} --wrap={shlex.quote(merge)})",
        'echo "write array: $array; merge: $merge"',
        "",
    ])
