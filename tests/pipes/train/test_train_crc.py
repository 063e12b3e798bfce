"""train_pipe checks each frame it reads whole against the crc32 in the index: damaged bytes are corrupt, not data."""

import logging

import numpy as np
import pytest
import torch
from helpers import make_shards

from episodepipes.pipes import EpisodeIndex
from episodepipes.pipes.train import train_pipe
from episodepipes.tarmembers import frame_fields

SHAPE = dict(num_episodes=2, length=8, height=32, width=48)  # train: ep0000 and ep0001, 16 frames


def _damage(tmp_path, episode, frame, field="front.jpg"):
    """Shards in which one byte in the middle of ``field`` of one frame is changed; the JPEG still decodes."""
    idx = EpisodeIndex.open(make_shards(tmp_path / "s", **SHAPE))
    ep = idx.episode(episode)
    shard, start, end = ep.frame_range(frame)
    path = idx.shard_path(shard)
    data = bytearray(path.read_bytes())
    member = frame_fields(lambda n, o: bytes(data[o:o + n]), start, end, episode, frame)[0][field]
    at = data.index(member, start) + len(member) // 2
    data[at] ^= 0x5A
    path.write_bytes(bytes(data))
    return idx


def _by_item(pipe):
    return {(e, f): (v, {k: b[k][i] for k in ("front", "wrist", "state")})
            for b in pipe for i, (e, f, v) in enumerate(zip(b["episode"], b["frame"].tolist(), b["valid"].tolist()))}


@pytest.mark.parametrize("method", ["thread", "process"])
def test_a_frame_whose_bytes_differ_from_its_crc_is_corrupt(tmp_path, caplog, method):
    import cv2

    idx = _damage(tmp_path, "ep0001", 3)
    shard, start, end = idx.episode("ep0001").frame_range(3)
    jpeg = frame_fields(lambda n, o: idx.shard_path(shard).read_bytes()[o:o + n], start, end, "ep0001", 3)[0]
    assert cv2.imdecode(np.frombuffer(jpeg["front.jpg"], np.uint8), cv2.IMREAD_COLOR) is not None  # still decodes
    pipe = train_pipe(idx, batch_size=4, seed=0, rank=0, world_size=1, method=method)
    with caplog.at_level(logging.WARNING):
        got = _by_item(pipe)
    assert len(got) == 16 and [k for k, (v, _) in got.items() if not v] == [("ep0001", 3)]
    assert all(not torch.any(t) for t in got[("ep0001", 3)][1].values())  # zeros, not the damaged data
    assert pipe.stats["frames_corrupt"] >= 1
    assert "ep0001" in caplog.text and "frame 3" in caplog.text


def test_a_damaged_camera_window_step_makes_its_samples_corrupt(tmp_path):
    idx = _damage(tmp_path, "ep0000", 5)
    got = _by_item(train_pipe(idx, batch_size=4, seed=0, rank=0, world_size=1, history={"front": 2}))
    assert sorted(k for k, (v, _) in got.items() if not v) == [("ep0000", 5), ("ep0000", 6)]  # 6 has 5 as history
    assert got[("ep0000", 6)][1]["front"].shape == (2, 3, 32, 48)


def test_on_corrupt_raise_names_shard_episode_and_frame(tmp_path):
    idx = _damage(tmp_path, "ep0001", 3)
    with pytest.raises(ValueError, match=r"shard-000000\.tar.*'ep0001'.*frame 3"):
        list(train_pipe(idx, batch_size=4, seed=0, rank=0, world_size=1, on_corrupt="raise"))


def test_undamaged_shards_are_all_valid(tmp_path):
    idx = EpisodeIndex.open(make_shards(tmp_path / "s", **SHAPE))
    assert idx.episode("ep0000").frame_crc(0) is not None
    pipe = train_pipe(idx, batch_size=4, seed=0, rank=0, world_size=1, history={"front": 2, "state": 3})
    assert all(v for v, _ in _by_item(pipe).values()) and pipe.stats["frames_corrupt"] == 0
