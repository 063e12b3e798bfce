import numpy as np
import pytest
import torch

from episodepipes.pipes import collate, video_pipe
from episodepipes.pipes.batch import BufferPool


def _sample(img, frame=0):
    return {"front": img, "state": np.arange(3, dtype=np.float32), "episode": "e", "frame": frame,
            "timestamp": frame / 10, "valid": True, "prompt": "p"}


def test_rows_of_one_buffer_collate_without_a_copy():
    slab = np.random.default_rng(0).integers(0, 255, (4, 3, 5, 6), dtype=np.uint8)
    b = collate([_sample(slab[i], i) for i in range(1, 4)])
    assert np.shares_memory(b["front"].numpy(), slab)
    np.testing.assert_array_equal(b["front"].numpy(), slab[1:4])
    assert b["frame"].dtype == torch.int64 and b["timestamp"].dtype == torch.float64 and b["valid"].dtype == torch.bool
    assert b["state"].shape == (3, 3) and b["episode"] == ["e"] * 3


def test_unrelated_arrays_are_stacked_into_a_copy():
    imgs = [np.full((3, 5, 6), i, np.uint8) for i in range(3)]
    b = collate([_sample(x) for x in imgs], BufferPool())
    assert not any(np.shares_memory(b["front"].numpy(), x) for x in imgs)
    assert b["front"][:, 0, 0, 0].tolist() == [0, 1, 2]


def test_buffer_pool_never_hands_out_a_buffer_still_in_use():
    pool = BufferPool()
    a = pool.get((2, 3), np.uint8)
    first = a.ctypes.data
    t = torch.from_numpy(a)[1:]  # a view of a tensor made from the buffer
    del a
    assert pool.get((2, 3), np.uint8).ctypes.data != first
    del t
    assert pool.get((2, 3), np.uint8).ctypes.data == first  # free again: its memory is lent again


HOLD = {"numpy view": lambda a: a[1:][0], "plain ndarray view": lambda a: np.asarray(a).view(np.ndarray)[2],
        "tensor view": lambda a: torch.from_numpy(a[2:])[0], "tensor's numpy": lambda a: torch.from_numpy(a).numpy(),
        "memoryview": memoryview}


@pytest.mark.parametrize("keep", HOLD)
def test_anything_made_from_a_lent_buffer_keeps_it_from_being_lent_again(keep):
    pool = BufferPool()
    a = pool.get((4, 3), np.uint8)
    first = a.ctypes.data
    held = HOLD[keep](a)
    del a
    b = pool.get((4, 3), np.uint8)
    assert b.ctypes.data != first  # still held through `held`: another buffer
    del b, held
    assert pool.get((4, 3), np.uint8).ctypes.data == first


@pytest.fixture(scope="module")
def shards(shard_folder):
    return shard_folder("batch", num_episodes=2, length=30, height=24, width=32)


def test_buffers_are_reused_when_the_consumer_lets_batches_go(shards):
    pipe = video_pipe(shards, episodes=["ep0000", "ep0001"], batch_size=4, max_batches=100)
    ptrs = [b["front"].data_ptr() for b in pipe]
    assert len(ptrs) == 15 and len(set(ptrs)) < 8
    kept = list(pipe)
    assert len({b["front"].data_ptr() for b in kept}) == 15


# torchdata.nodes' public names on its main branch (meta-pytorch/data), a superset of the pinned release's
TORCHDATA_NODES = {"BaseNode", "Batcher", "Collator", "Compose", "Cycler", "Filter", "Header", "IterableWrapper",
                   "Loader", "MapStyleWrapper", "Mapper", "MultiNodeWeightedSampler", "ParallelMapper", "PinMemory",
                   "Prefetcher", "SamplerWrapper", "Shuffler", "Stateful", "StopCriteria", "T", "Unbatcher"}


def test_no_public_pipes_name_is_also_a_torchdata_node():
    import torchdata.nodes

    import episodepipes.pipes

    assert set(episodepipes.pipes.__all__).isdisjoint(TORCHDATA_NODES | set(torchdata.nodes.__all__))


@pytest.mark.filterwarnings("error:The given NumPy array is not writable")
def test_a_read_only_scalar_of_a_one_sample_batch_is_copied_into_a_writable_tensor():
    data = np.array([7], np.int64).tobytes()
    scalar = np.frombuffer(data, np.int64).reshape(())  # as load_npy gives a scalar member: a view of its bytes
    b = collate([{**_sample(np.zeros((3, 2, 2), np.uint8)), "count": scalar}])
    assert b["count"].tolist() == [7]
    b["count"] += 1  # a writable tensor of its own
    assert b["count"].tolist() == [8] and scalar == 7
