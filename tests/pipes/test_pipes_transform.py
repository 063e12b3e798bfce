"""``transform=`` on metric_pipe and video_pipe: in the decode workers, checked at build, as in train_pipe."""

import multiprocessing
import threading

import numpy as np
import pytest
import torch

from episodepipes.pipes import metric_pipe, video_pipe


@pytest.fixture(scope="module")
def shards(shard_folder):
    return shard_folder("transform", num_episodes=6, length=9, height=32, width=40)


def plus_frame(sample):
    """A module-level transform (it pickles into process workers): adds a key and changes an array."""
    return {**sample, "state": sample["state"] * 0 + sample["frame"], "extra": np.float32(sample["frame"] * 10)}


def as_list(sample):
    return list(sample.values())


def drop_reserved(sample):
    """A new dict without the batch keys: they are restored after the transform."""
    return {"state": sample["state"], "action": sample["action"], "front": sample["front"], "valid": True}


def _metric(shards, **kw):
    return metric_pipe(shards, split="val", frames_per_episode=4, batch_size=3, rank=0, world_size=1, **kw)


def _video(shards, **kw):
    return video_pipe(shards, episodes=["ep0002", "ep0005"], batch_size=4, max_batches=10, **kw)


@pytest.mark.parametrize("method", ["thread", "process"])
@pytest.mark.parametrize("build", [_metric, _video])
def test_transform_output_is_in_every_batch(shards, build, method):
    plain = list(build(shards, method=method))
    changed = list(build(shards, method=method, transform=plus_frame))
    assert len(plain) == len(changed) > 1
    for a, b in zip(plain, changed):
        assert torch.equal(b["extra"], a["frame"].float() * 10)
        assert torch.equal(b["state"], a["frame"].float()[:, None].expand_as(a["state"]))
        assert torch.equal(b["action"], a["action"]) and torch.equal(b["front"], a["front"])
        assert b["episode"] == a["episode"] and torch.equal(b["frame"], a["frame"])


@pytest.mark.parametrize("method", ["thread", "process"])
@pytest.mark.parametrize("name, build", [("metric_pipe", _metric), ("video_pipe", _video)])
def test_a_transform_returning_no_dict_is_refused_naming_the_pipe(shards, name, build, method):
    with pytest.raises(TypeError, match=rf"^{name}: transform=.*as_list.* returned list; it should return the sample"):
        list(build(shards, method=method, transform=as_list))


@pytest.mark.parametrize("name, build", [("metric_pipe", _metric), ("video_pipe", _video)])
def test_a_transform_that_does_not_pickle_is_refused_at_build_for_processes(shards, name, build):
    with pytest.raises(TypeError, match=rf"^{name}: transform=.* does not pickle"):
        build(shards, method="process", transform=lambda s: s)
    with pytest.raises(TypeError, match=rf"^{name}: transform=3 should be a callable"):
        build(shards, transform=3)
    assert len(list(build(shards, method="thread", transform=lambda s: s))) > 0  # threads need no pickling


def test_dropped_or_changed_batch_keys_are_restored_so_padding_stays_invalid(shards):
    """6 chosen frames over 4 ranks: 2 padding samples; a transform that drops the keys cannot make them valid."""
    valid = []
    for rank in range(4):
        kw = dict(split="val", frames_per_episode=3, batch_size=4, rank=rank, world_size=4)
        plain = list(metric_pipe(shards, **kw))
        dropped = list(metric_pipe(shards, transform=drop_reserved, **kw))
        for a, b in zip(plain, dropped, strict=True):
            for key in ("episode", "frame", "timestamp", "valid", "prompt"):
                assert torch.equal(b[key], a[key]) if torch.is_tensor(a[key]) else b[key] == a[key], key
            valid += b["valid"].tolist()
    assert sorted(valid) == [False] * 2 + [True] * 6


@pytest.mark.parametrize("method", ["thread", "process"])
def test_a_closed_gate_with_a_transform_starts_no_worker(shards, method):
    before = set(threading.enumerate()) | set(multiprocessing.active_children())
    pipe = _video(shards, method=method, transform=plus_frame, gate=lambda: False)
    for _ in range(2):
        assert list(pipe) == []
    assert not (set(threading.enumerate()) | set(multiprocessing.active_children())) - before
    assert pipe.stats["workers_started"] == 0 and pipe.stats["frames_decoded"] == 0
    assert pipe.stats["closed_passes"] == 2


@pytest.mark.parametrize("method", ["thread", "process"])
def test_transform_on_h264_shards_in_both_pipes(tmp_path, method):
    """Video-codec cameras decode through another frame decoder; the transform runs after it the same way."""
    from helpers import write_raw

    from episodepipes.sharding.cli import main
    from episodepipes.sharding.formats.synthetic import SyntheticReader

    src = write_raw(tmp_path / "src", SyntheticReader(num_episodes=3, length=8, height=32, width=32))
    assert main(["write", str(src), str(tmp_path / "out"), "--workers", "1", "--codec", "h264", "--gop", "4"]) == 0
    out = tmp_path / "out"
    for build in (lambda **kw: video_pipe(out, episodes=["ep0001"], batch_size=4, max_batches=4, **kw),
                  lambda **kw: metric_pipe(out, frames_per_episode=3, batch_size=2, rank=0, world_size=1, **kw)):
        plain, changed = list(build(method=method)), list(build(method=method, transform=plus_frame))
        assert len(plain) == len(changed) > 0
        for a, b in zip(plain, changed):
            assert torch.equal(a["front"], b["front"]) and torch.equal(b["extra"], a["frame"].float() * 10)
