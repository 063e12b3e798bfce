"""share_frames: a camera frame that several samples of a batch show is decoded once, and copied exactly."""

from dataclasses import dataclass

import numpy as np
import pytest
from helpers import make_shards

from episodepipes.pipes import EpisodeIndex
from episodepipes.pipes.batch import BatchStacker
from episodepipes.pipes.decode import Decoder
from episodepipes.pipes.frames import JPEG
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


def _damage_frame(idx, episode, frame, field="front.jpg"):
    """Change one byte in the middle of ``field`` of one frame of ``idx``'s shards (its crc32 then mismatches)."""
    from episodepipes.tarmembers import frame_fields

    shard, start, end = idx.episode(episode).frame_range(frame)
    path = idx.shard_path(shard)
    data = bytearray(path.read_bytes())
    member = frame_fields(lambda n, o: bytes(data[o:o + n]), start, end, episode, frame)[0][field]
    data[data.index(member, start) + len(member) // 2] ^= 0x5A
    path.write_bytes(bytes(data))


def _samples(idx, method):
    from episodepipes.pipes.train import train_pipe

    pipe = train_pipe(idx, batch_size=16, seed=0, rank=0, world_size=1, history={"front": 3}, method=method)
    return {(e, f): (v, {k: b[k][i].clone() for k in ("front", "wrist", "state")})
            for b in pipe for i, (e, f, v) in enumerate(zip(b["episode"], b["frame"].tolist(), b["valid"].tolist()))}


@pytest.mark.parametrize("method", ["thread", "process"])
def test_a_corrupt_frame_invalidates_only_the_samples_that_show_it(tmp_path, method):
    # one batch of all 16 frames: samples sharing frames with the damaged one's windows borrow from them
    shape = dict(num_episodes=2, length=8, height=24, width=32)
    want = _samples(EpisodeIndex.open(make_shards(tmp_path / "clean", **shape)), method)
    idx = EpisodeIndex.open(make_shards(tmp_path / "s", **shape))
    _damage_frame(idx, "ep0000", 3)
    got = _samples(idx, method)
    shows = {("ep0000", t) for t in (3, 4, 5)}  # front windows t-2..t hold frame 3
    assert len(got) == 16 and {k for k, (v, _) in got.items() if not v} == shows
    for k, (_, fields) in got.items():
        if k not in shows:
            for name, t in fields.items():
                np.testing.assert_array_equal(t.numpy(), want[k][1][name].numpy(), err_msg=f"{k} {name}")


@dataclass(frozen=True)
class _Refuses:
    """JPEG frames, but ``bad`` (one frame's bytes) does not decode: a corrupt frame without a crc32 to catch it."""

    bad: bytes

    def field(self, camera):
        return JPEG.field(camera)

    def decode(self, camera, data, **kw):
        return None if bytes(data) == self.bad else JPEG.decode(camera, data, **kw)


def _valid_and_front(idx, frames):
    eps = idx.split("train")
    windows = plan_windows({"front": 3}, {}, cameras=set(eps[0].cameras), arrays=set(eps[0].arrays))
    reader = TrainReader(idx, eps, windows=windows, seed=0, rank=0, world_size=1, batch_size=16, epochs=1)
    dec = Decoder(reader, idx, num_workers=2, method="thread", frames=frames, share_frames=True, cursor=reader)
    stacker = BatchStacker(dec, batch_size=16, rows=dec)
    stacker.reset(None)
    return {(e, f): (v, b["front"][i].clone()) for b in stacker
            for i, (e, f, v) in enumerate(zip(b["episode"], b["frame"].tolist(), b["valid"].tolist()))}


def test_a_frame_that_does_not_decode_invalidates_only_the_samples_that_show_it(tmp_path):
    from episodepipes.tarmembers import frame_fields

    idx = EpisodeIndex.open(make_shards(tmp_path / "s", num_episodes=2, length=8, height=24, width=32))
    shard, start, end = idx.episode("ep0000").frame_range(3)
    data = idx.shard_path(shard).read_bytes()
    bad = frame_fields(lambda n, o: data[o:o + n], start, end, "ep0000", 3)[0]["front.jpg"]
    want, got = _valid_and_front(idx, JPEG), _valid_and_front(idx, _Refuses(bad))
    shows = {("ep0000", t) for t in (3, 4, 5)}  # front windows t-2..t hold frame 3
    assert len(got) == 16 and {k for k, (v, _) in got.items() if not v} == shows
    for k, (_, front) in got.items():
        if k not in shows:
            np.testing.assert_array_equal(front.numpy(), want[k][1].numpy(), err_msg=str(k))
