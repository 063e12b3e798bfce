"""`write --codec copy` end to end: LeRobot and raw mp4 sources shard without re-encoding, and video_pipe and
metric_pipe read every frame back equal to PyAV's own decode of the source file over the episode's range."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from helpers import decode_rgb, raw_mp4_source

from benchmarks.lerobot_data import IMAGE_KEY, VIDEO_KEYS, make_lerobot
from episodepipes.index import EpisodeIndex
from episodepipes.pipes import metric_pipe, video_pipe
from episodepipes.sharding.cli import main
from episodepipes.sharding.formats.synthetic import SyntheticReader

LENGTHS = (9, 7, 11)  # at GOP 4 in one shared mp4, episodes 1 and 2 start mid-GOP (frames 9 and 16)


def _write(src, out, *args):
    assert main(["write", str(src), str(out), "--codec", "copy", "--workers", "2", "--shard-size", "8kB", *args]) == 0
    return out


def _frames(batches, cams):
    return {(e, int(f), c): (img.numpy().transpose(1, 2, 0), bool(v)) for b in batches for c in cams
            for e, f, img, v in zip(b["episode"], b["frame"], b[c], b["valid"])}


def _check(out, want, cams):
    """video_pipe over every episode, and metric_pipe's sparse frames, equal ``want[(episode, frame, camera)]``."""
    index = EpisodeIndex.open(out, verify=True)
    seq = _frames(video_pipe(out, episodes=[e.id for e in index.episodes], batch_size=5, max_batches=100), cams)
    assert seq.keys() == want.keys()
    for k, (img, valid) in seq.items():
        assert valid and np.array_equal(img, want[k]), k
    sparse = _frames(metric_pipe(out, split="train", frames_per_episode=3, batch_size=2, num_workers=2), cams)
    assert sparse and any(f % 4 for _, f, _ in sparse)  # mid-GOP frames, decoded from the keyframe before them
    for k, (img, valid) in sparse.items():
        assert valid and np.array_equal(img, want[k]), k


@pytest.mark.parametrize("encoder", ["libsvtav1", "libx264"])
def test_lerobot_v3_with_episodes_sharing_an_mp4_copies_frame_exact(tmp_path, encoder):
    src = make_lerobot(tmp_path / "lr", lengths=LENGTHS, num_episodes=3, episodes_per_file=3, gop=4, encoder=encoder)
    out = _write(tmp_path / "lr", tmp_path / "out")
    index = EpisodeIndex.open(out)
    assert len(index.shards) > 1
    codec = "av1" if encoder == "libsvtav1" else "h264"
    cams = [k.replace(".", "_") for k in VIDEO_KEYS]
    for ep in index.episodes:  # the source's codec and GOP, per camera
        assert {c: (ep.cameras[c].codec, ep.cameras[c].gop) for c in cams} == {c: (codec, 4) for c in cams}
    options = json.loads((out / "index.json").read_text())["options"]
    assert options["codec"] == "copy" and "gop" not in options and "crf" not in options
    meta = pq.read_table(tmp_path / "lr/meta/episodes/chunk-000/file-000.parquet").to_pylist()
    want = {}
    for key, cam in zip(VIDEO_KEYS, cams):
        frames = decode_rgb(next((tmp_path / "lr/videos" / key).rglob("*.mp4")))
        assert len(frames) == sum(LENGTHS)
        for m, ep in zip(meta, index.episodes, strict=True):
            first = round(m[f"videos/{key}/from_timestamp"] * 10)  # the episode's range in the shared file
            want.update({(ep.id, t, cam): frames[first + t] for t in range(ep.length)})
    _check(out, want, cams)
    # the image feature (PNG cells) has no packets: it is stored as JPEG beside the copied cameras
    assert all(ep.cameras["observation_images_gripper"].codec == "jpeg" for ep in index.episodes)
    got = _frames(video_pipe(out, episodes=["episode_000002"], batch_size=4, max_batches=100),
                  ["observation_images_gripper"])
    for (_, t, _), (img, valid) in got.items():
        assert valid and np.abs(img.astype(float) - src[2].frames[IMAGE_KEY][t]).mean() < 5, t


def test_raw_mp4_episodes_copy_frame_exact(tmp_path):
    synth = SyntheticReader(num_episodes=3, length=10, height=48, width=64, cameras=("front", "wrist"))
    src, want = raw_mp4_source(tmp_path / "src", synth)
    out = _write(src, tmp_path / "out")
    ep = EpisodeIndex.open(out).episode("ep0001")
    assert {c: (ep.cameras[c].codec, ep.cameras[c].gop) for c in ("front", "wrist")} == {"front": ("h264", 4),
                                                                                         "wrist": ("av1", 4)}
    _check(out, want, ["front", "wrist"])
