"""Batches of train_pipe on packed (h264) shards are writable tensors: no tensor over a record's read-only bytes."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import write_raw

from episodepipes.pipes import train_pipe
from episodepipes.sharding.cli import main
from episodepipes.sharding.formats.synthetic import SyntheticReader

pytestmark = pytest.mark.filterwarnings("error:The given NumPy array is not writable")


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """h264 shards whose episodes have a per-step scalar array (``done``, shape ())."""
    d = tmp_path_factory.mktemp("packed_rows")
    src = write_raw(d / "src", SyntheticReader(num_episodes=3, length=5, height=32, width=48))
    for ep in sorted(src.iterdir()):
        arrays = dict(np.load(ep / "arrays.npz"))
        arrays["done"] = np.arange(len(arrays["state"])) == len(arrays["state"]) - 1
        np.savez(ep / "arrays.npz", **arrays)
    assert main(["write", str(src), str(d / "h264"), "--workers", "1", "--codec", "h264", "--gop", "2"]) == 0
    return d / "h264"


@pytest.mark.parametrize("method", ["thread", "process"])
def test_one_sample_batches_of_a_scalar_array_are_writable_tensors(packed, method):
    seen = []
    for b in train_pipe(packed, batch_size=1, seed=0, method=method, num_workers=1):
        assert b["done"].shape == (1,) and b["done"].dtype.is_floating_point is False
        b["done"].logical_not_()  # a tensor of its own: writing it touches no shard bytes
        seen.append((b["episode"][0], int(b["frame"][0]), not bool(b["done"][0])))
    assert len(seen) == 10  # 2 train episodes of 5 frames (every third episode is val)
    assert sorted(s for s in seen if s[2]) == [(e, 4, True) for e in sorted({s[0] for s in seen})]
