"""A train_pipe built before the process group started refuses to iterate, in a real 2-process gloo group."""

from __future__ import annotations

import pytest
from helpers import gloo_rank, iter_error, make_shards, spawn_two_ranks

from episodepipes.pipes.train import train_pipe

pytestmark = pytest.mark.slow  # two real DDP ranks: `pytest -m 'not slow'` leaves it out; `make test` runs it

DEADLINE = 120  # seconds: a hang fails the test instead of the suite


def _rank_main(rank: int, root: str, port: int, out: str) -> None:
    early = train_pipe(root, batch_size=2, seed=0, num_workers=1)  # no group yet: rank 0 of 1
    with gloo_rank(rank, port, out) as record:
        record["error"] = iter_error(early)
        late = train_pipe(root, batch_size=2, seed=0, num_workers=1)
        record["items"] = [(e, f) for b in late for e, f in zip(b["episode"], b["frame"].tolist())]


def test_a_train_pipe_built_before_ddp_started_refuses_to_iterate(tmp_path):
    root = make_shards(tmp_path / "s", num_episodes=2, length=8, height=16, width=24)  # train: 16 frames
    ranks = spawn_two_ranks(_rank_main, tmp_path, str(root), deadline=DEADLINE)
    for r, got in enumerate(ranks):
        assert got["error"] is not None and "built for rank=0, world_size=1" in got["error"]
        assert f"rank={r} of world_size=2" in got["error"]
    a, b = ({tuple(i) for i in got["items"]} for got in ranks)
    assert len(a) == len(b) == 8 and not a & b  # built inside the group: split, not repeated
