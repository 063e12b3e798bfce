"""Hostile conditions around the decode workers: a shard cut short under a running pass, a lock held by a thread
when process workers start, a stuck or dead worker, and the process running a pass killed outright."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from helpers import make_shards

from episodepipes.errors import WorkerError
from episodepipes.pipes import metric_pipe, train_pipe
from episodepipes.pipes._decode import executor as _executor

TESTS = Path(__file__).resolve().parents[1]

# Runs a pass, cuts every shard short in place after its first batch (what `cp` over a shard or
# `rsync --inplace` does), and reads on: the pass must end in an error naming the shard, not a fault.
_CUT_SHORT = """
import os, sys
from episodepipes.pipes import EpisodeIndex, metric_pipe, train_pipe
root, kind, method = sys.argv[1:4]
idx = EpisodeIndex.open(root)
if kind == "train":
    pipe = train_pipe(root, batch_size=4, seed=0, rank=0, world_size=1, num_workers=2, method=method)
else:
    pipe = metric_pipe(root, split="train", frames_per_episode=40, batch_size=4, rank=0, world_size=1,
                       num_workers=2, method=method)
it = iter(pipe)
next(it)
for i in range(len(idx.shards)):
    os.truncate(idx.shard_path(i), 1024)
for _ in it:
    pass
print("no error")
"""


def _run(script: str, *args: str, timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), str(TESTS), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script), *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind,method", [("train", "thread"), ("train", "process"), ("metric", "thread")])
def test_a_shard_cut_short_during_a_pass_is_an_error_naming_it_not_sigbus(tmp_path, kind, method):
    root = make_shards(tmp_path / "s", num_episodes=4, length=40, height=32, width=32, shard_size=1 << 30)
    proc = _run(_CUT_SHORT, str(root), kind, method, timeout=90)
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-2000:])  # -7 would be SIGBUS
    last = proc.stderr.strip().splitlines()[-1]
    assert "ShardTruncatedError" in last and str(root / "shard-000000.tar") in last, last


_HELD = threading.Lock()  # held by a parent thread while process workers start (a decode lock, an OpenCV mutex...)


def _takes_the_lock(sample: dict) -> dict:
    """A transform that needs the lock a thread of the parent held when the pool started."""
    with _HELD:
        return sample


def _never_returns(sample: dict) -> dict:
    threading.Event().wait()
    return sample


def _dies(sample: dict) -> dict:
    os.kill(os.getpid(), signal.SIGKILL)
    return sample


def _pipe(root: Path, transform, **kw):  # noqa: ANN001, ANN202
    return metric_pipe(root, split="train", frames_per_episode=4, batch_size=2, rank=0, world_size=1, num_workers=2,
                       method="process", transform=transform, **kw)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    return make_shards(tmp_path_factory.mktemp("workers") / "s", num_episodes=2, length=8, height=16, width=16)


@pytest.mark.timeout(60)
def test_process_workers_do_not_inherit_a_lock_a_thread_holds_when_they_start(small):
    release = threading.Event()
    holding = threading.Event()

    def hold() -> None:  # a thread inside a locked region for the whole pass start, as a decode thread may be
        with _HELD:
            holding.set()
            release.wait(30)

    t = threading.Thread(target=hold)
    t.start()
    holding.wait()
    try:
        it = iter(_pipe(small, _takes_the_lock))
        first = next(it)  # a forked worker would wait forever on the copy of the held lock; a fork server's does not
    finally:
        release.set()
        t.join()
    assert len(first["frame"]) == 2 and len(list(it)) == 3


@pytest.mark.timeout(60)
def test_a_stuck_worker_ends_the_pass_with_an_error_naming_it_within_the_bound(small, monkeypatch):
    monkeypatch.setattr(_executor, "STALL", 3.0)
    t0 = time.monotonic()
    with pytest.raises(WorkerError, match=r"decode worker \(pid \d+.*returned nothing for 3 s"):
        list(_pipe(small, _never_returns))
    assert time.monotonic() - t0 < 30


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["metric", "train"])  # one pool per worker (GOP lanes); one pool of two workers
def test_a_dead_worker_ends_the_pass_with_an_error_naming_it(small, kind):
    # the worker SIGKILLed comes first, with its own exit code: never 255 (its status read by two threads at
    # once), nor a sibling the executor stopped as the pass ended (-15)
    pipe = _pipe(small, _dies) if kind == "metric" else train_pipe(
        small, batch_size=2, seed=0, rank=0, world_size=1, num_workers=2, method="process", transform=_dies)
    with pytest.raises(WorkerError, match=r"a decode worker died \(pid \d+ \(exit code -9\)"):
        list(pipe)


# Runs a process-method pass and sits inside it: its workers are alive, waiting for their next task.
_SITS = """
import os, sys, time
from episodepipes.pipes import metric_pipe
pipe = metric_pipe(sys.argv[1], split="train", frames_per_episode=4, batch_size=2, rank=0, world_size=1,
                   num_workers=2, method="process")
it = iter(pipe)
next(it)
print("ready", flush=True)
time.sleep(600)
"""


def _descendants(pid: int) -> set[int]:
    """The live (not zombie) processes below ``pid``, from /proc."""
    parents: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = Path(f"/proc/{d}/stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if fields[0] != "Z":
                parents[int(d)] = int(fields[1])
    out, todo = set(), [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parents.items() if pp == p]
        out.update(kids)
        todo += kids
    return out


def _alive(pids: set[int]) -> set[int]:
    left = set()
    for p in pids:
        try:
            if Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                left.add(p)
        except OSError:
            pass
    return left


@pytest.mark.timeout(120)
def test_decode_workers_die_with_the_process_running_the_pass(small):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), str(TESTS), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_SITS), str(small)], stdout=subprocess.PIPE,
                            text=True, env=env)
    try:
        assert proc.stdout.readline().strip() == "ready"
        below = _descendants(proc.pid)
        assert len(below) >= 2  # the two workers (and the fork server above them)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 10
        while _alive(below) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(below), f"decode workers {sorted(_alive(below))} outlived the killed pass"
    finally:
        proc.kill()
        for p in _alive(_descendants(proc.pid)):
            os.kill(p, signal.SIGKILL)
