"""Hostile conditions around the decode workers: a shard cut short under a running pass, a lock held by a thread
when process workers start, a stuck or dead worker, and the process running a pass killed outright."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import make_shards

TESTS = Path(__file__).resolve().parent

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
