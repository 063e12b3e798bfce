"""Slurm job arrays: the job index from the array's environment, and the shipped script run on a real Slurm.

The cluster is real: munged, slurmctld and slurmd (Debian's munge and slurm-wlm, `.ci/slurm.sh` installs them)
started on localhost from a ~25-line slurm.conf in a temporary folder, stopped by their PIDs at the end.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time
from pathlib import Path

import pytest
from fleetcheck import same_content
from helpers import write_raw

from episodepipes.sharding.cli import main
from episodepipes.sharding.formats.synthetic import SyntheticReader
from episodepipes.sharding.slurm import job_index, submit_script

ROOT = Path(__file__).resolve().parents[2]


def _env(task, count, low, high):
    return {"SLURM_ARRAY_TASK_ID": str(task), "SLURM_ARRAY_TASK_COUNT": str(count),
            "SLURM_ARRAY_TASK_MIN": str(low), "SLURM_ARRAY_TASK_MAX": str(high)}


@pytest.mark.parametrize(("env", "index"), [(_env(2, 4, 0, 3), 2), (_env(1, 4, 1, 4), 0), (_env(4, 4, 1, 4), 3)])
def test_the_job_index_is_the_tasks_place_in_its_array(env, index):
    assert job_index(4, None, env) == index
    assert job_index(4, 1, env) == 1  # an explicit --job-index wins
    assert job_index(4, None, {}) == 0  # outside an array: job 0, as before


@pytest.mark.parametrize(("env", "needle"), [
    (_env(2, 3, 0, 2), "SLURM_ARRAY_TASK_COUNT=3 tasks but --num-jobs is 4; submit --array=0-3"),
    (_env(2, 4, 0, 6), "ids run 0..6 with gaps or a step"),
    (_env(9, 4, 0, 3), "SLURM_ARRAY_TASK_ID=9 is outside its array 0..3"),
    ({**_env(1, 4, 0, 3), "SLURM_ARRAY_TASK_MIN": "x"}, "SLURM_ARRAY_TASK_MIN='x' is not a task number"),
])
def test_an_array_that_disagrees_with_num_jobs_is_refused_by_name(env, needle):
    with pytest.raises(ValueError, match=re.escape(needle)):
        job_index(4, None, env)


def test_write_under_a_wrong_array_size_writes_nothing(tmp_path, monkeypatch, capsys):
    src = write_raw(tmp_path / "src", SyntheticReader(num_episodes=4, length=2, height=16, width=16))
    for k, v in _env(1, 3, 0, 2).items():
        monkeypatch.setenv(k, v)
    assert main(["write", str(src), str(tmp_path / "out"), "--num-jobs", "4", "--workers", "1"]) == 2
    assert "SLURM_ARRAY_TASK_COUNT=3 tasks but --num-jobs is 4" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_finished_array_task_run_again_does_nothing(tmp_path, monkeypatch, capsys):
    src = write_raw(tmp_path / "src", SyntheticReader(num_episodes=4, length=2, height=16, width=16))
    for k, v in _env(1, 2, 0, 1).items():
        monkeypatch.setenv(k, v)
    argv = ["write", str(src), str(tmp_path / "out"), "--num-jobs", "2", "--workers", "1"]
    assert main(argv) == 0
    index = tmp_path / "out" / "_jobs" / "job-0001" / "index.json"
    before = index.stat().st_mtime_ns
    assert main(argv) == 0 and "job 1 of 2 already finished" in capsys.readouterr().out
    assert index.stat().st_mtime_ns == before


def test_the_script_quotes_every_word_and_names_the_dependency():
    text = submit_script("/data/my src", "/out dir", 4, ["--shard-size", "1GB"], sbatch_args=["--time=1:00:00"],
                         merge_args=["--repack"], python="/venv/bin/python")
    assert "--array=0-3 --time=1:00:00" in text and "--dependency=afterok:\"$array\"" in text
    assert "write '/data/my src' '/out dir' --num-jobs 4 --shard-size 1GB" in text.replace("'\"'\"'", "'")
    assert "merge '/out dir' --repack" in text.replace("'\"'\"'", "'")


# ---------------------------------------------------------------- a real Slurm on localhost

_CONF = """\
ClusterName=episodepipes
SlurmctldHost=localhost
SlurmctldPort={ctld}
SlurmdPort={d}
AuthType=auth/munge
AuthInfo=socket={root}/munge/sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
MinJobAge=3600
# a job starts as soon as a CPU is free: the default batch_sched_delay (3 s) was most of the test's time
SchedulerParameters=batch_sched_delay=0,sched_interval=1
NodeName=localhost NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _until(what: str, ok, timeout: float, logs: list[Path]) -> None:
    end = time.monotonic() + timeout
    while not ok():
        if time.monotonic() > end:
            tails = "\n".join(f"{p}: {p.read_text()[-800:] if p.exists() else '(none)'}" for p in logs)
            pytest.fail(f"{what} not within {timeout} s\n{tails}")
        time.sleep(0.2)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """A one-node Slurm on localhost; yields the environment its clients need. Daemons stopped by PID."""
    root = tmp_path_factory.mktemp("slurm")
    (root / "munge").mkdir(mode=0o700)
    for d in ("state", "spool"):
        (root / d).mkdir()
    key = root / "munge" / "key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    conf = root / "slurm.conf"
    conf.write_text(_CONF.format(ctld=_port(), d=_port(), root=root))
    env = dict(os.environ, SLURM_CONF=str(conf), PYTHONPATH=str(ROOT))
    procs: list[subprocess.Popen] = []
    logs = [root / "munge" / "log", root / "slurmctld.log", root / "slurmd.log"]
    try:
        procs.append(subprocess.Popen(["munged", "--foreground", f"--socket={root}/munge/sock", f"--key-file={key}",
                                       f"--pid-file={root}/munge/pid", f"--log-file={root}/munge/log",
                                       f"--seed-file={root}/munge/seed", "--force"], env=env))
        _until("munged's socket", (root / "munge" / "sock").exists, 20, logs)
        procs.append(subprocess.Popen(["slurmctld", "-D", "-f", str(conf)], env=env))
        procs.append(subprocess.Popen(["slurmd", "-D", "-N", "localhost", "-f", str(conf)], env=env))

        def idle() -> bool:
            out = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True, timeout=10)
            return out.stdout.strip() == "idle"

        _until("the Slurm node idle", idle, 60, logs)
        yield env
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in reversed(procs):
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=15)


def _state(env: dict, job: str) -> str:
    out = subprocess.run(["scontrol", "show", "job", job], env=env, capture_output=True, text=True, timeout=10)
    m = re.search(r"JobState=(\w+)", out.stdout)
    return m.group(1) if m else "UNKNOWN"


def test_the_shipped_script_runs_a_4_task_array_and_its_merge_on_a_real_slurm(slurm, tmp_path, capsys):
    src = write_raw(tmp_path / "src", SyntheticReader(num_episodes=9, length=3, height=16, width=16))
    common = ["--shard-size", "6kB", "--workers", "1", "--val-fraction", "0.3"]
    assert main(["write", str(src), str(tmp_path / "one"), *common]) == 0
    ids = {}
    for name, extra in (("inplace", []), ("repack", ["--repack"])):
        capsys.readouterr()
        assert main(["sbatch", str(src), str(tmp_path / name), "--num-jobs", "4", *extra,
                     f"--sbatch-option=--output={tmp_path}/{name}-%A_%a.log", "--", *common]) == 0
        script = tmp_path / f"{name}.sh"
        script.write_text(capsys.readouterr().out)
        done = subprocess.run(["bash", str(script)], env=slurm, capture_output=True, text=True, timeout=60,
                              cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        ids[name] = re.search(r"write array: (\d+); merge: (\d+)", done.stdout).groups()
    logs = sorted(tmp_path.glob("*.log"))

    def ended() -> bool:
        return all(_state(slurm, m) not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING") for _, m in ids.values())

    try:
        _until("the merges", ended, 240, logs)
    finally:
        for array, merge in ids.values():  # nothing left queued on a failure
            subprocess.run(["scancel", array, merge], env=slurm, capture_output=True, timeout=10)
    for _, merge in ids.values():
        assert _state(slurm, merge) == "COMPLETED", [p.read_text() for p in logs]
    files = {p.name: p.read_bytes() for p in sorted((tmp_path / "one").iterdir()) if p.is_file()}
    assert {p.name: p.read_bytes() for p in sorted((tmp_path / "repack").iterdir()) if p.is_file()} == files
    assert same_content(tmp_path / "inplace", tmp_path / "one")
    assert not (tmp_path / "inplace" / "_jobs").exists()
