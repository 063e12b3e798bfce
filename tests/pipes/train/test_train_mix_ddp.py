"""A train_pipe mixture in a real 2-process gloo group: the ranks split each global step of the 1-process run,
with the same number of batches, and resume from rank 0's state (as Lightning saves it) where they were."""

from __future__ import annotations

import itertools
import json
import os
from datetime import timedelta

import pytest
import torch.distributed as dist
from helpers import make_shards, spawn_two_ranks

from episodepipes.pipes import Source
from episodepipes.pipes.train import train_pipe

pytestmark = pytest.mark.slow  # two real DDP ranks: `pytest -m 'not slow'` leaves it out; `make test` runs it

DEADLINE = 120  # seconds: a hang fails the test instead of the suite
KW = dict(seed=7, num_workers=1, history={"state": 2}, epochs=2)


def _mix(a: str, b: str) -> dict:
    return {"a": Source(a, 0.7), "b": Source(b, 0.3)}


def _items(batches) -> list:  # noqa: ANN001
    return [list(zip(b["source"], b["episode"], b["frame"].tolist())) for b in batches]


def _rank_main(rank: int, a: str, b: str, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=timedelta(seconds=60))
    try:
        pipe = train_pipe(_mix(a, b), batch_size=3, **KW)  # rank and world size from the group
        full = _items(pipe)
        pipe = train_pipe(_mix(a, b), batch_size=3, **KW)
        head = _items(itertools.islice(iter(pipe), 5))
        saved = [pipe.state_dict()]
        dist.broadcast_object_list(saved, src=0)  # every rank resumes from rank 0's state
        again = train_pipe(_mix(a, b), batch_size=3, **KW)
        again.load_state_dict(saved[0])
        rest = _items(again)
        with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
            json.dump({"len": len(pipe), "full": full, "head": head, "rest": rest}, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_a_mixture_splits_and_resumes_over_two_ddp_ranks(tmp_path):
    a = make_shards(tmp_path / "a", num_episodes=3, length=10, height=16, width=24, seed=1)  # train: 20 frames
    b = make_shards(tmp_path / "b", num_episodes=4, length=6, height=16, width=24, seed=2)  # train: 18 frames
    ranks = spawn_two_ranks(_rank_main, tmp_path, str(a), str(b), deadline=DEADLINE)
    one = _items(train_pipe(_mix(str(a), str(b)), batch_size=6, rank=0, world_size=1, **KW))
    for got in ranks:
        assert len(got["full"]) == got["len"] == len(one)
        assert [[tuple(x) for x in s] for s in got["head"] + got["rest"]] == [[tuple(x) for x in s]
                                                                              for s in got["full"]]
    for step, want in enumerate(one):
        assert sorted(tuple(x) for r in ranks for x in r["full"][step]) == sorted(want)
    assert {s for r in ranks for b in r["full"] for s, _, _ in b} == {"a", "b"}
