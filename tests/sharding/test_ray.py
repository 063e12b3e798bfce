"""`episodepipes-shard ray` on a real local Ray cluster: a head and a second node (`ray start`), four write tasks
and the merge, checked against one `write`. The cluster's processes are stopped by their process groups (each
`ray start --block` is started in a session of its own), never by a name pattern."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from fleetcheck import same_content
from helpers import write_raw

from episodepipes.sharding.cli import main
from episodepipes.sharding.formats.synthetic import SyntheticReader

ROOT = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).with_name("ray"))


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(procs: list[subprocess.Popen]) -> None:
    """SIGTERM to every node's process group at once, SIGKILL to what is left after a second (a graceful Ray
    stop waits for its workers and agents for tens of seconds, which tests nothing here)."""
    for sig, grace in ((signal.SIGTERM, 1.0), (signal.SIGKILL, 20.0)):
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, sig)
        end = time.monotonic() + grace
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=max(end - time.monotonic(), 0.01))
    for p in procs:  # what the group's leader left behind in its group
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _started(log: Path, times: int) -> bool:
    """Whether ``ray start`` said it started ``times`` times in the shared start log (cheaper than connecting)."""
    return log.read_text().count("Ray runtime started") >= times


def _wait_for_nodes(address: str, count: int, deadline: float, procs: list[subprocess.Popen], said: Path) -> None:
    """Until ``count`` nodes are alive as a driver sees them, polled from this process's own connection (a new
    interpreter per poll cost seconds each); disconnected after, so the command under test connects itself."""
    import ray

    ray.init(address=address, log_to_driver=False)
    try:
        while len([n for n in ray.nodes() if n["Alive"]]) < count:
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), said.read_text()
            time.sleep(0.2)
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def ray_cluster():
    """A head and a second node on 127.0.0.1, one CPU each; yields the head's address."""
    temp = tempfile.mkdtemp(prefix="epr", dir="/tmp")  # short: Ray's socket paths live under it
    port = _port()
    env = dict(os.environ, PYTHONPATH=str(ROOT), RAY_USAGE_STATS_ENABLED="0")
    common = ["--node-ip-address", "127.0.0.1", "--num-cpus", "1", "--object-store-memory", str(80 * 2**20),
              "--block", "--disable-usage-stats", "--include-log-monitor=false"]
    procs: list[subprocess.Popen] = []
    log = open(Path(temp) / "start.log", "w")  # noqa: SIM115 - closed below
    try:
        procs.append(subprocess.Popen([RAY, "start", "--head", "--port", str(port), "--temp-dir", temp, "--no-monitor",
                                       "--include-dashboard=false", *common], env=env, start_new_session=True,
                                      stdout=log, stderr=subprocess.STDOUT))
        address, said = f"127.0.0.1:{port}", Path(temp) / "start.log"
        deadline = time.monotonic() + 120
        while not _listening(port):  # the head's GCS is up: the second node can join while the head starts the rest
            assert time.monotonic() < deadline and procs[0].poll() is None, said.read_text()
            time.sleep(0.2)
        procs.append(subprocess.Popen([RAY, "start", "--address", address, *common], env=env,
                                      start_new_session=True, stdout=log, stderr=subprocess.STDOUT))
        while not _started(said, 2):
            assert time.monotonic() < deadline and procs[1].poll() is None, said.read_text()
            time.sleep(0.2)
        _wait_for_nodes(address, 2, deadline, procs, said)  # both registered with the head
        yield address
    finally:
        _stop(procs)
        log.close()
        shutil.rmtree(temp, ignore_errors=True)


def test_the_ray_command_runs_4_write_tasks_and_repacks_them_to_one_writes_bytes(ray_cluster, tmp_path, capsys):
    src = write_raw(tmp_path / "src", SyntheticReader(num_episodes=9, length=3, height=16, width=16))
    common = ["--shard-size", "6kB", "--workers", "1", "--val-fraction", "0.3"]
    assert main(["write", str(src), str(tmp_path / "one"), *common]) == 0
    capsys.readouterr()
    assert main(["ray", str(src), str(tmp_path / "repack"), "--num-jobs", "4", "--repack", "--address", ray_cluster,
                 "--", *common]) == 0
    out = capsys.readouterr()
    assert out.err.count("write job ") == 4 and "(4/4)" in out.err, out.err  # progress, one line per job
    files = {p.name: p.read_bytes() for p in sorted((tmp_path / "one").iterdir()) if p.is_file()}
    assert {p.name: p.read_bytes() for p in sorted((tmp_path / "repack").iterdir()) if p.is_file()} == files


def test_a_failing_ray_job_is_named_and_the_finished_ones_are_kept(ray_cluster, tmp_path, capsys):
    src = write_raw(tmp_path / "src", SyntheticReader(num_episodes=4, length=2, height=16, width=16))
    (src / "ep0003" / "front" / "000001.png").write_bytes(b"not a png")
    argv = ["ray", str(src), str(tmp_path / "o"), "--num-jobs", "2", "--address", ray_cluster, "--", "--workers", "1"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "write job 1 of 2 failed" in err and "000001.png" in err and "write jobs [1] of 2 failed" in err, err
    assert (tmp_path / "o" / "_jobs" / "job-0000" / "index.json").exists()
    assert main([*argv, "--skip-bad"]) == 0  # a re-run runs only the unfinished job, then merges in place
    assert "1 of 2 write jobs already finished" in capsys.readouterr().err
    assert main(["write", str(src), str(tmp_path / "one"), "--workers", "1", "--skip-bad"]) == 0
    assert same_content(tmp_path / "o", tmp_path / "one")  # the default merge: the one write's content
