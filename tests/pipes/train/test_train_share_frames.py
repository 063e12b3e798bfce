"""share_frames: a camera frame that several samples of a batch show is decoded once, and copied exactly."""

import numpy as np
import pytest
from helpers import make_shards

from episodepipes.pipes import EpisodeIndex
from episodepipes.pipes.batch import BatchStacker
from episodepipes.pipes.decode import Decoder
from episodepipes.pipes.order.window import plan_windows
from episodepipes.pipes.stats import Stats
from episodepipes.pipes.train import TrainReader


def _batches(idx, *, share, method, stats):
    eps = idx.split("train")
    windows = plan_windows({"front": 3}, {"state": 2}, cameras=set(eps[0].cameras), arrays=set(eps[0].arrays))
    reader = TrainReader(idx, eps, windows=windows, seed=0, rank=0, world_size=1, batch_size=6, epochs=1)
    dec = Decoder(reader, idx, num_workers=2, method=method, stats=stats, share_frames=share, cursor=reader,
                  slices=reader.send_slices)
    stacker = BatchStacker(dec, batch_size=6, stats=stats, rows=dec)
    stacker.reset(None)
    return list(stacker)


@pytest.mark.parametrize("method", ["thread", "process"])
def test_each_distinct_frame_of_a_batch_is_decoded_once_and_every_sample_gets_it(tmp_path, method):
    idx = EpisodeIndex.open(make_shards(tmp_path / "s", num_episodes=2, length=10, height=24, width=32))
    plain, shared = Stats(), Stats()
    want = _batches(idx, share=False, method=method, stats=plain)
    got = _batches(idx, share=True, method=method, stats=shared)
    distinct = 0
    for a, b in zip(want, got, strict=True):
        assert a["episode"] == b["episode"] and a["frame"].tolist() == b["frame"].tolist()
        for k in ("front", "front_pad", "wrist", "state", "state_pad", "valid"):
            np.testing.assert_array_equal(a[k].numpy(), b[k].numpy())
        keys = set()
        for e, t in zip(b["episode"], b["frame"].tolist()):
            keys |= {(e, t, "wrist")} | {(e, max(t + d, 0), "front") for d in (-2, -1, 0)}
        distinct += len(keys)
    assert shared["frames_decoded"] == distinct < plain["frames_decoded"]  # overlaps exist, and are shared
    assert shared["frames_corrupt"] == plain["frames_corrupt"] == 0
