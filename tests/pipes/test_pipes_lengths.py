from collections import Counter

import pytest
from helpers import make_shards
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from episodepipes.pipes import EpisodeIndex, metric_pipe, video_pipe
from episodepipes.pipes.plan import metric_items

LENGTHS = (3, 9, 1, 14, 6, 2, 11, 5)


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    out = make_shards(tmp_path_factory.mktemp("len") / "s", num_episodes=len(LENGTHS), lengths=LENGTHS,
                      height=16, width=24, cameras=("front",), shard_size=6_000)
    return EpisodeIndex.open(out)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(split=st.sampled_from(["train", "val"]), k=st.integers(1, 12), batch=st.integers(1, 7),
       world=st.integers(1, 4), sampling=st.sampled_from(["even", "random"]))
def test_metric_lengths_match_batches_and_ranks_partition_the_chosen_frames(index, split, k, batch, world, sampling):
    valid, lengths = Counter(), set()
    for rank in range(world):
        pipe = metric_pipe(index, split=split, frames_per_episode=k, batch_size=batch, rank=rank, world_size=world,
                           sampling=sampling, seed=7)
        batches = list(pipe)
        assert len(batches) == len(pipe)
        lengths.add(len(pipe))
        for b in batches:
            valid.update((e, f) for e, f, v in zip(b["episode"], b["frame"].tolist(), b["valid"].tolist()) if v)
    assert len(lengths) == 1
    chosen = metric_items(index.split(split), k, sampling=sampling, seed=7)
    assert valid == Counter((i.episode, i.frame) for i in chosen)


@settings(max_examples=20, deadline=None)
@given(eps=st.lists(st.sampled_from([f"ep{i:04d}" for i in range(len(LENGTHS))]), min_size=1, max_size=3, unique=True),
       batch=st.integers(1, 6), cap=st.integers(1, 6))
def test_video_lengths_match_batches_and_frames_come_in_order(index, eps, batch, cap):
    pipe = video_pipe(index, episodes=eps, batch_size=batch, max_batches=cap)
    batches = list(pipe)
    assert len(batches) == len(pipe)
    got = [(e, f) for b in batches for e, f in zip(b["episode"], b["frame"].tolist())]
    full = [(e, f) for e in eps for f in range(index.episode(e).length)]
    assert got == full[: batch * cap]


def test_rank_defaults_to_single_process(index):
    pipe = metric_pipe(index, split="train", frames_per_episode=2, batch_size=3)
    n = sum(min(2, e.length) for e in index.split("train"))
    assert len(pipe) == len(list(pipe)) == -(-n // 3)


def test_rank_and_world_size_come_from_torch_distributed_when_initialised(index, monkeypatch):
    import torch.distributed as dist

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda: 2)
    monkeypatch.setattr(dist, "get_world_size", lambda: 3)
    auto = metric_pipe(index, split="train", frames_per_episode=4, batch_size=2)
    explicit = metric_pipe(index, split="train", frames_per_episode=4, batch_size=2, rank=2, world_size=3)
    assert len(auto) == len(explicit)
    assert [b["frame"].tolist() for b in auto] == [b["frame"].tolist() for b in explicit]
