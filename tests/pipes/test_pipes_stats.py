"""`pipe.stats`: every counter a pass adds is declared in `KEYS`, present (at 0) before the first pass."""

from __future__ import annotations

import pytest

from episodepipes.pipes import video_pipe
from episodepipes.pipes.stats import KEYS, Stats


@pytest.fixture(scope="module")
def shards(shard_folder):
    return shard_folder("stats", num_episodes=2, length=12, height=32, width=48)


def test_worker_cpu_is_a_declared_counter():
    assert Stats()["worker_cpu_us"] == 0  # the process pool adds it as it closes; a reader needs no .get


@pytest.mark.parametrize("method", ["thread", "process"])
def test_a_pass_adds_only_declared_counters(shards, method):
    pipe = video_pipe(shards, episodes=["ep0000", "ep0001"], batch_size=2, max_batches=4, method=method)
    assert len(list(pipe)) == 4
    assert set(pipe.stats) == set(KEYS), sorted(set(pipe.stats) ^ set(KEYS))
