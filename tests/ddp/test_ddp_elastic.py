"""Elastic resume under real DDP: a Lightning checkpoint of a 2-rank gloo fit resumes on 1 rank at the same
global batch, and the samples trained on before and after are the uninterrupted run's, none repeated or skipped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import make_shards, run_script_ranks

from episodepipes.index import EpisodeIndex
from episodepipes.lightning_glue.launch import check_ranks
from episodepipes.pipes.train import train_pipe

pytestmark = pytest.mark.slow  # real multi-process DDP: `pytest -m 'not slow'` leaves it out; `make test` runs it

APP = Path(__file__).with_name("elastic_app.py")
SHAPE = dict(num_episodes=6, lengths=(12, 7, 5, 9, 11, 4), height=16, width=24)  # train: 39 frames
STOP = 8  # global steps before the checkpoint: into epoch 1 (39 // 6 = 6 steps per epoch)


def _ranks(root: Path, out: Path, nprocs: int, *args: str) -> list[dict]:
    check_ranks(run_script_ranks(APP, str(root), str(out), "--devices", str(nprocs), *args, nprocs=nprocs, out=out,
                                 timeout=150))
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(nprocs)]


def _stream(per_rank: list[list[list]]) -> list[tuple[str, int]]:
    """Interleave the ranks' batches into the global order: step s, sample i of rank r is s*W*B + i*W + r."""
    world, out = len(per_rank), []
    for step in zip(*per_rank, strict=True):
        out += [tuple(step[r][i]) for i in range(len(step[0])) for r in range(world)]
    return out


def test_a_two_rank_checkpoint_resumes_on_one_rank_at_the_same_global_batch(tmp_path):
    root = make_shards(tmp_path / "s", shard_size=20_000, **SHAPE)
    first = _ranks(root, tmp_path / "w2", 2, "--batch", "3", "--stop", str(STOP))
    assert [r["world_size"] for r in first] == [2, 2] and [len(r["seen"]) for r in first] == [STOP, STOP]
    (ckpt,) = (tmp_path / "w2" / "ckpt").glob("*.ckpt")
    saved = torch.load(ckpt, weights_only=False)["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]
    cursor = saved["root"]["source"]["source"]
    assert (cursor["world_size"], cursor["batch_size"], cursor["epoch"], cursor["consumed"]) == (2, 3, 1, 12)
    (rest,) = _ranks(root, tmp_path / "w1", 1, "--batch", "6", "--ckpt", str(ckpt))
    assert len(rest["seen"]) == 12 - STOP

    want = [(e, f) for b in train_pipe(root, batch_size=6, seed=2, rank=0, world_size=1, epochs=2)
            for e, f in zip(b["episode"], b["frame"].tolist())]  # the uninterrupted run at the new size
    before, after = _stream([r["seen"] for r in first]), _stream([rest["seen"]])
    assert before + after == want
    assert len(set(want[:36])) == len(set(want[36:])) == 36  # two epochs, each sample once


def test_a_two_rank_rank_block_checkpoint_resumes_on_one_rank_at_another_global_batch(tmp_path):
    """shuffle="rank_block" deals the epoch's blocks to the ranks by world size and batch size; a checkpoint of 2
    ranks x 3 resumed on 1 rank x 3 (on_resize="next_step": 3 divides the 12 frames consumed) reads the rest of
    the saved epoch on the saved shares, the undealt tails included: every train frame of that epoch once."""
    root = make_shards(tmp_path / "s", shard_size=20_000, **SHAPE)
    first = _ranks(root, tmp_path / "w2", 2, "--batch", "3", "--stop", str(STOP), "--shuffle", "rank_block")
    (ckpt,) = (tmp_path / "w2" / "ckpt").glob("*.ckpt")
    (rest,) = _ranks(root, tmp_path / "w1", 1, "--batch", "3", "--ckpt", str(ckpt), "--shuffle", "rank_block",
                     "--on-resize", "next_step")
    before = _stream([r["seen"] for r in first])
    assert len(before) == STOP * 6 and len(set(before[:36])) == 36  # epoch 0 (36 of 39 frames), then 2 steps of 1
    epoch1 = before[36:] + [tuple(x) for b in rest["seen"] for x in b]
    assert len(rest["seen"]) == 39 // 3 - 12 // 3  # the new size's steps of epoch 1 after the 12 frames consumed
    assert len(epoch1) == len(set(epoch1)) == 39  # every train frame once: no repeat, none left out
    assert set(epoch1) == {(e.id, f) for e in EpisodeIndex.open(root).split("train") for f in range(e.length)}
