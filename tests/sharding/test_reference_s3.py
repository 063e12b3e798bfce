"""A ``--codec reference`` index kept locally, its dataset read from an S3 root (moto behind a counting proxy): the
same frames as PyAV's decode of the local copy, fetched by byte range (never a whole mp4), and a replaced object is
refused by name."""

from __future__ import annotations

import numpy as np
from helpers import decode_rgb

from benchmarks.lerobot_data import VIDEO_KEYS, make_lerobot
from episodepipes.errors import ShardIOError
from episodepipes.index import EpisodeIndex
from episodepipes.pipes import metric_pipe, video_pipe
from episodepipes.sharding.cli import main

BUCKET = "reference"
CAMS = [k.replace(".", "_") for k in VIDEO_KEYS]


def _upload(moto, src, prefix):
    c = moto.client()
    if BUCKET not in {b["Name"] for b in c.list_buckets().get("Buckets", [])}:
        c.create_bucket(Bucket=BUCKET)
    for p in sorted(src.rglob("*")):
        if p.is_file():
            c.put_object(Bucket=BUCKET, Key=f"{prefix}/{p.relative_to(src).as_posix()}", Body=p.read_bytes())


def test_a_dataset_on_s3_is_read_in_place_by_byte_range(tmp_path, moto, proxy):
    src = tmp_path / "lr"
    make_lerobot(src, lengths=(30, 30, 30), num_episodes=3, episodes_per_file=3, gop=2, encoder="libx264",
                 height=240, width=320, image_feature=False)
    out = tmp_path / "ref"
    assert main(["write", str(src), str(out), "--format", "lerobot", "--codec", "reference"]) == 0
    _upload(moto, src, "lr")
    index = EpisodeIndex.open(out, source_root=f"s3://{BUCKET}/lr")
    want = {}
    for key, cam in zip(VIDEO_KEYS, CAMS):
        frames = decode_rgb(next((src / "videos" / key).rglob("*.mp4")))
        want.update({(e.id, t, cam): frames[30 * k + t] for k, e in enumerate(index.episodes) for t in range(30)})
    proxy.reset()
    eid = index.episodes[1].id
    got = {(e, int(f), c): (img.numpy().transpose(1, 2, 0), bool(v))
           for b in video_pipe(index, episodes=[eid], batch_size=10, max_batches=10) for c in CAMS
           for e, f, img, v in zip(b["episode"], b["frame"], b[c], b["valid"])}
    assert len(got) == 60
    for k, (img, valid) in got.items():
        assert valid and np.array_equal(img, want[k]), k
    assert all(rng is not None for _, path, rng in proxy.gets() if "/videos/" in path)  # ranged GETs only
    videos = sum(p.stat().st_size for p in src.rglob("*.mp4"))
    assert proxy.body_bytes < videos / 2  # one episode of three, and the stamps: never the whole files
    sparse = metric_pipe(index, split="train", frames_per_episode=2, batch_size=3)
    for b in sparse:
        for e, f, img in zip(b["episode"], b["frame"], b[CAMS[0]]):
            assert np.array_equal(img.numpy().transpose(1, 2, 0), want[e, int(f), CAMS[0]])
    other = tmp_path / "other"
    make_lerobot(other, lengths=(30, 30, 30), num_episodes=3, episodes_per_file=3, gop=2, encoder="libx264",
                 height=240, width=320, image_feature=False, seed=1)
    _upload(moto, other, "lr")  # the dataset re-uploaded with other content under the same root
    again = EpisodeIndex.open(out, source_root=f"s3://{BUCKET}/lr")
    try:
        list(video_pipe(again, episodes=[eid], batch_size=10, max_batches=10))
    except ShardIOError as e:
        assert "changed after it was indexed" in str(e) and f"s3://{BUCKET}/lr/videos/" in str(e)
    else:
        raise AssertionError("a replaced object was read")
