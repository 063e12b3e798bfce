"""A pipe built before the process group started refuses to iterate, in a real 2-process gloo group."""

from __future__ import annotations

import pytest
from helpers import gloo_rank, iter_error, make_shards, spawn_two_ranks

from episodepipes.pipes import metric_pipe

pytestmark = pytest.mark.slow  # two real DDP ranks: `pytest -m 'not slow'` leaves it out; `make test` runs it

DEADLINE = 120  # seconds: a hang fails the test instead of the suite


def _rank_main(rank: int, root: str, port: int, out: str) -> None:
    """One rank: a pipe built before init_process_group, one after, one with an explicit rank."""
    early = metric_pipe(root, frames_per_episode=4, batch_size=2)  # no group yet: rank 0 of 1
    with gloo_rank(rank, port, out) as record:
        record["error"] = iter_error(early)
        late = metric_pipe(root, frames_per_episode=4, batch_size=2)
        record["frames"] = [f for b in late for f in b["frame"].tolist()]
        record["alone"] = len(list(metric_pipe(root, frames_per_episode=4, batch_size=2, rank=0, world_size=1)))


def test_a_pipe_built_before_ddp_started_refuses_to_iterate(tmp_path):
    root = make_shards(tmp_path / "s", num_episodes=3, length=8, height=16, width=24)  # val: ep0002
    ranks = spawn_two_ranks(_rank_main, tmp_path, str(root), deadline=DEADLINE)
    for r, got in enumerate(ranks):
        assert got["error"] is not None and "built for rank=0, world_size=1" in got["error"]
        assert f"rank={r} of world_size=2" in got["error"] and "val_dataloader()" in got["error"]
        assert "_partial_: true" in got["error"] and got["alone"] == 2
    whole = [f for b in metric_pipe(root, frames_per_episode=4, batch_size=2, rank=0, world_size=1)
             for f in b["frame"].tolist()]
    assert len(ranks[0]["frames"]) == len(ranks[1]["frames"]) == 2  # built inside the group: split, not repeated
    assert sorted(ranks[0]["frames"] + ranks[1]["frames"]) == sorted(whole)
