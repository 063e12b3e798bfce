"""A packed (video-codec) index under an S3 root: it opens without reading its per-frame columns (each segment's
frames are checked on first use instead), and `train_pipe` reads each frame's record once: the read-ahead fetches the
records back to each camera step's key frame, and the sample uses them (counted at moto behind the proxy)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers import write_raw
from remotecases import plain

from episodepipes.format import COLUMNS
from episodepipes.index import EpisodeIndex, IndexFormatError
from episodepipes.index.columns import PROBE
from episodepipes.pipes import video_pipe
from episodepipes.pipes.train import train_pipe
from episodepipes.sharding.cli import main
from episodepipes.sharding.formats.synthetic import SyntheticReader

BUCKET = "packedtrain"
URL = f"s3://{BUCKET}/h264"


@pytest.fixture(scope="module")
def packed(moto, tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("packed-train")
    src = write_raw(tmp / "src", SyntheticReader(num_episodes=4, length=12, height=32, width=48))
    out = tmp / "h264"
    assert main(["write", str(src), str(out), "--workers", "1", "--shard-size", "12kB", "--codec", "h264",
                 "--gop", "4"]) == 0
    assert len(EpisodeIndex.open(out).shards) > 1
    moto.upload_dir(out, BUCKET, "h264")
    return out


def _shard_bytes(proxy) -> tuple[int, int]:  # noqa: ANN001
    """(GETs, bytes) of the shards (not the index's own files), from the ranges asked."""
    spans = [r.removeprefix("bytes=").split("-") for m, p, r in proxy.requests if m == "GET" and p.endswith(".tar")]
    return len(spans), sum(int(b) - int(a) + 1 for a, b in spans)


WINDOWS = dict(history={"front": 2, "state": 3}, horizon={"action": 4})


@pytest.mark.parametrize("options", [{}, WINDOWS, dict(shuffle="block", block_frames=6, window_blocks=2, **WINDOWS)])
def test_remote_packed_training_fetches_each_record_once(packed, proxy, options):
    kw = dict(batch_size=4, seed=3, rank=0, world_size=1, num_workers=1, **options)
    want = plain(train_pipe(packed, **kw))
    index = EpisodeIndex.open(URL)
    proxy.reset()
    pipe = train_pipe(index, **kw)
    assert plain(pipe) == want
    gets, fetched = _shard_bytes(proxy)
    used = pipe.stats["bytes_read"]  # every record a sample parsed, back to its key frames
    # each batch's records come in its read-ahead, near ones in one GET (at most 10% read between them), and the
    # sample reads nothing again: the old reader fetched the frames ahead and then their key ranges once more
    assert used > 0 and fetched <= 1.1 * used
    assert gets < len(want) * kw["batch_size"]  # fewer GETs than samples: a batch's near records share one


PER_FRAME = ("offset", "size", "crc32", "member", "key")


def test_a_packed_index_opens_without_reading_its_per_frame_columns(packed, proxy):
    proxy.reset()
    index = EpisodeIndex.open(URL)
    files = {COLUMNS[n][0]: n for n in PER_FRAME}
    gets = sorted((files[p.rsplit("/", 1)[1]], r) for m, p, r in proxy.requests
                  if m == "GET" and p.rsplit("/", 1)[1] in files)
    assert gets == sorted((n, f"bytes=0-{PROBE - 1}") for n in PER_FRAME)  # a header each, no rows
    opened = proxy.body_bytes
    proxy.reset()
    video = dict(episodes=[index.episodes[1].id], batch_size=4, max_batches=100)
    assert plain(video_pipe(index, **video)) == plain(video_pipe(packed, **video))
    assert proxy.body_bytes > 0 and opened < 5 * PROBE + 8 * 1024  # the JSON and the per-episode tables beside


def test_a_packed_frame_whose_key_leaves_its_chunk_is_refused_on_first_use(moto, packed, proxy, tmp_path):
    bad = shutil.copytree(packed, tmp_path / "bad")
    key = np.load(bad / COLUMNS["key"][0])
    index = EpisodeIndex.open(packed)
    ep = index.episodes[2]
    key[ep.rows.start + 1] = ep.rows.start + 2  # frame 1 decodes from frame 2: after itself
    np.save(bad / COLUMNS["key"][0], key)
    with pytest.raises(IndexFormatError, match="key"):  # locally every frame is checked at open
        EpisodeIndex.open(bad)
    moto.upload_dir(bad, BUCKET, "badkey")
    remote = EpisodeIndex.open(f"s3://{BUCKET}/badkey")  # opens: no frame of it is read yet
    assert plain(video_pipe(remote, episodes=[index.episodes[0].id], batch_size=4, max_batches=100)) == \
        plain(video_pipe(packed, episodes=[index.episodes[0].id], batch_size=4, max_batches=100))
    with pytest.raises(IndexFormatError, match=f"episode '{ep.id}' segment 0: frame 1 of the segment: its key"):
        list(video_pipe(remote, episodes=[ep.id], batch_size=4, max_batches=100))


def test_a_reference_index_trains_from_s3_reading_each_record_once_in_either_order(moto, proxy, tmp_path):
    from benchmarks.lerobot_data import make_lerobot

    src, out = tmp_path / "lr", tmp_path / "ref"
    make_lerobot(src, lengths=(20, 20, 20), num_episodes=3, episodes_per_file=2, gop=2, encoder="libx264",
                 height=48, width=64, image_feature=False)
    assert main(["write", str(src), str(out), "--format", "lerobot", "--codec", "reference"]) == 0
    client = moto.client()
    client.create_bucket(Bucket="lerobot")
    for p in sorted(src.rglob("*")):
        if p.is_file():
            client.put_object(Bucket="lerobot", Key=f"lr/{p.relative_to(src).as_posix()}", Body=p.read_bytes())
    kw = dict(batch_size=4, seed=2, rank=0, world_size=1, num_workers=1)
    for order in ({}, dict(shuffle="block", block_frames=8, window_blocks=2)):  # the block order read no reference
        want = plain(train_pipe(EpisodeIndex.open(out, source_root=src), **kw, **order))
        index = EpisodeIndex.open(out, source_root="s3://lerobot/lr")
        assert plain(train_pipe(index, **kw, **order)) == want  # each file's size and end stamps checked first
        proxy.reset()
        pipe = train_pipe(index, **kw, **order)
        assert plain(pipe) == want
        if not order:  # every frame's packets fetched once for its batch, none again by its sample
            assert proxy.body_bytes <= 1.1 * pipe.stats["bytes_read"]
