from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from episodepipes.pipes.plan import Item, choose_frames, num_batches, per_rank, split_even, video_items


@given(st.integers(1, 300), st.integers(1, 50), st.sampled_from(["even", "random"]), st.integers(0, 3))
def test_choose_frames_are_distinct_sorted_in_range_and_deterministic(length, k, sampling, seed):
    frames = choose_frames(length, k, sampling=sampling, seed=seed, key="ep")
    assert frames == sorted(set(frames)) and len(frames) == min(k, length)
    assert all(0 <= f < length for f in frames)
    assert frames == choose_frames(length, k, sampling=sampling, seed=seed, key="ep")


@given(st.integers(0, 200), st.integers(1, 9), st.integers(1, 16))
def test_split_is_even_and_valid_samples_partition_the_items(n, world, batch):
    items = [Item(f"e{i // 7}", i % 7) for i in range(n)]
    parts = [split_even(items, rank=r, world_size=world) for r in range(world)]
    assert {len(p) for p in parts} <= {per_rank(n, world) if n else 0}
    assert len({num_batches(len(p), batch) for p in parts}) == 1
    valid = Counter(i for p in parts for i in p if i.valid)
    assert valid == Counter(items)
    real = set(items)
    assert all(i._replace(valid=True) in real for p in parts for i in p)  # padding repeats real frames


@given(st.lists(st.integers(1, 30), min_size=1, max_size=5), st.integers(1, 8), st.integers(1, 10))
def test_video_items_stop_at_the_cap_and_keep_order(lengths, batch, cap):
    from types import SimpleNamespace

    eps = [SimpleNamespace(id=f"e{i}", length=n) for i, n in enumerate(lengths)]
    items = video_items(eps, batch_size=batch, max_batches=cap)
    full = [Item(e.id, f) for e in eps for f in range(e.length)]
    assert items == full[: batch * cap]
    assert num_batches(len(items), batch) == min(cap, num_batches(len(full), batch))
