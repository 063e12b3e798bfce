"""metric_pipe plans only this rank's share: the same items as splitting the whole plan, chosen per episode of the
share only."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from benchmarks.scale_order import synthetic_index
from episodepipes.pipes import metric_pipe
from episodepipes.pipes import plan as planning
from episodepipes.pipes.plan import Item, metric_items, rank_items, split_even


class _Episode:  # what metric_items reads of an episode
    def __init__(self, id: str, length: int) -> None:
        self.id, self.length = id, length


@given(lengths=st.lists(st.integers(0, 9), max_size=12), k=st.integers(1, 5), world=st.integers(1, 9),
       sampling=st.sampled_from(["even", "random"]), seed=st.integers(0, 3))
def test_a_ranks_share_is_the_whole_plans_split(lengths, k, world, sampling, seed):
    ids = [f"e{i}" for i in range(len(lengths))]
    whole = metric_items([_Episode(i, n) for i, n in zip(ids, lengths)], k, sampling=sampling, seed=seed)
    for rank in range(world):
        got, total = rank_items(ids, lengths, k, rank=rank, world_size=world, sampling=sampling, seed=seed)
        assert total == len(whole)
        assert got == split_even(whole, rank=rank, world_size=world)


def test_bad_options_are_refused_by_name():
    for k in (0, 2.5, True):
        with pytest.raises(ValueError, match="frames_per_episode"):
            rank_items(["a"], [3], k, rank=0, world_size=1)
    with pytest.raises(ValueError, match="sampling='odd'"):
        rank_items(["a"], [3], 1, rank=0, world_size=1, sampling="odd")
    assert rank_items(["a"], [3], 1, rank=0, world_size=2)[0] == [Item("a", 1, valid=False)]  # padding only


def test_metric_planning_on_a_rank_chooses_frames_of_its_share_only(tmp_path, monkeypatch):
    root = synthetic_index(tmp_path / "d", episodes=20_000, frames=100_000, split="val")
    calls = []
    real = planning.choose_frames
    monkeypatch.setattr(planning, "choose_frames", lambda *a, **kw: calls.append(a) or real(*a, **kw))
    pipe = metric_pipe(root, frames_per_episode=4, batch_size=16, rank=3, world_size=8, sampling="random")
    assert len(pipe) == -(-20_000 * 4 // 8 // 16)
    assert len(calls) <= 20_000 // 8 + 2  # the episodes of rank 3's block (and one either side), not all 20000


def test_a_metric_pass_locates_a_chunk_of_its_items_before_the_first_batch(tmp_path):
    """Before: the reader planned the byte runs of its whole share (10^4 items here, 5*10^5 at 10^6 val episodes),
    one id lookup and one Episode each, before its first batch."""
    root = synthetic_index(tmp_path / "d", episodes=20_000, frames=100_000, split="val", shard_files=True)
    pipe = metric_pipe(root, frames_per_episode=4, batch_size=16, rank=3, world_size=8, num_workers=1)
    index = pipe.index
    located = []
    real = index.frame_ranges
    index.frame_ranges = lambda rows, *a: located.append(len(rows)) or real(rows, *a)
    try:
        batch = next(iter(pipe))
    finally:
        del index.frame_ranges
    assert len(batch["frame"]) == 16
    assert sum(located) <= planning.CHUNK < 20_000 * 4 // 8, located  # one chunk of the rank's 10^4 items
    made = len(index.episodes._made)  # Episode objects: those of the batch's samples (the decoder's), not the plan's
    assert made <= 16, made


def test_runs_planned_a_chunk_at_a_time_are_the_runs_of_the_whole(tmp_path, monkeypatch):
    """A run of adjacent frames longer than a chunk is one run, and every run is what one pass over all gives."""
    root = synthetic_index(tmp_path / "d", episodes=50, frames=5_000, split="val")
    from episodepipes.index import EpisodeIndex

    index = EpisodeIndex.open(root)
    items = [Item(e.id, f) for e in index.episodes for f in range(e.length)]
    whole = planning.read_runs(index, items)
    monkeypatch.setattr(planning, "CHUNK", 7)
    assert planning.read_runs(index, items) == whole
    assert len(whole) == len({r.shard for r in whole})  # every frame of a shard adjacent: a run per shard
    assert all(r.crcs == (0,) * len(r.items) for r in whole)
    with pytest.raises(KeyError, match="'nope' is not in"):
        planning.read_runs(index, [*items[:3], Item("nope", 0)])
    with pytest.raises(IndexError, match="frame 100 is outside episode"):
        planning.read_runs(index, [Item(index.ids[2], 100)])
