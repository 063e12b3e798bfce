"""Every pipe, the index and the CLI on an S3 root (moto behind a counting proxy) yield what they do locally."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from helpers import as_v1, make_shards, write_raw
from remotecases import plain, s3_secrets_absent

from episodepipes.format import COLUMNS
from episodepipes.index import EpisodeIndex, IndexFormatError
from episodepipes.index.columns import PROBE, by_range
from episodepipes.pipes import metric_pipe, video_pipe
from episodepipes.pipes.plan import metric_items, read_runs
from episodepipes.pipes.read import ShardReader
from episodepipes.pipes.train import train_pipe
from episodepipes.sharding.cli import main
from episodepipes.sharding.formats.synthetic import SyntheticReader

BUCKET = "pipes"
SHAPE = dict(num_episodes=6, lengths=(12, 7, 5, 9, 11, 4), height=16, width=24)
WINDOWS = dict(history={"state": 3, "front": 2}, horizon={"action": 4})


@pytest.fixture(scope="module")
def shards(moto, shard_folder) -> Path:
    out = shard_folder("remote-pipes", shard_size=20_000, **SHAPE)
    moto.upload_dir(out, BUCKET, "v1")
    return out


URL = f"s3://{BUCKET}/v1"


def test_the_index_opens_from_s3_as_it_does_locally(shards, proxy):
    local, remote = EpisodeIndex.open(shards), EpisodeIndex.open(URL + "/")
    # the index.json (its size by a HEAD, then its bytes), then one GET from byte 0 of each column: the whole of a
    # per-episode one, the header of a per-frame one (and its size, which the GET's answer carries)
    files = ["index.json", *(COLUMNS[c][0] for c in remote.meta["columns"])]
    assert [r[1] for r in proxy.gets()] == [f"/{BUCKET}/v1/{n}" for n in files]
    assert [r[1] for r in proxy.requests if r[0] == "HEAD"] == [f"/{BUCKET}/v1/index.json"]
    assert all(rng.startswith("bytes=0-") for _, _, rng in proxy.gets())
    ranged = [c for c in remote.meta["columns"] if by_range(c, remote.meta["columns"][c], remote.meta)]
    assert sorted(ranged) == ["crc32", "offset", "size"]
    whole = ["index.json", *(COLUMNS[c][0] for c in remote.meta["columns"] if c not in ranged)]
    assert proxy.body_bytes == sum((shards / n).stat().st_size for n in whole) + sum(
        min(PROBE, (shards / COLUMNS[c][0]).stat().st_size) for c in ranged)
    assert remote.remote and not local.remote and remote.root == URL
    assert remote.data == local.data and remote.fingerprint == local.fingerprint and remote.version == 2
    assert remote.source is remote.source and remote.source.root == URL
    with pytest.raises(KeyError, match=rf"not in {URL}/index.json"):
        remote.episode("nope")
    with pytest.raises(ValueError, match="remote root"):
        remote.shard_path(0)
    proxy.reset()
    remote.verify()  # the columns' sha256, each shard's size, sha256 and every frame's crc32, through the source
    columns = sum((shards / COLUMNS[c][0]).stat().st_size for c in local.meta["columns"])
    assert proxy.body_bytes == sum(s.bytes for s in local.shards) + columns


def test_a_missing_or_hostile_remote_index_is_refused_by_name(moto, shards, proxy, caplog):
    caplog.set_level(logging.DEBUG, logger="episodepipes")  # not boto3's own debug lines (the test's uploads)
    c = moto.client()
    with pytest.raises(FileNotFoundError, match=rf"no index.json at s3://{BUCKET}/nothing-here") as e1:
        EpisodeIndex.open(f"s3://{BUCKET}/nothing-here")
    c.put_object(Bucket=BUCKET, Key="bad/index.json", Body=b"{not json")
    with pytest.raises(IndexFormatError, match=rf"s3://{BUCKET}/bad/index.json: not valid JSON") as e2:
        EpisodeIndex.open(f"s3://{BUCKET}/bad")
    hostile = (shards / "index.json").read_text().replace('"shard-000000.tar"', '"../../etc/passwd"')
    c.put_object(Bucket=BUCKET, Key="hostile/index.json", Body=hostile.encode())
    with pytest.raises(IndexFormatError, match=rf"s3://{BUCKET}/hostile/index.json") as e3:
        EpisodeIndex.open(f"s3://{BUCKET}/hostile")
    moto.upload_dir(shards, BUCKET, "nocol")
    c.delete_object(Bucket=BUCKET, Key="nocol/index.offset.npy")
    with pytest.raises(IndexFormatError, match=rf"s3://{BUCKET}/nocol/index.offset.npy is missing") as e4:
        EpisodeIndex.open(f"s3://{BUCKET}/nocol")
    c.put_object(Bucket=BUCKET, Key="nocol/index.offset.npy", Body=(shards / "index.size.npy").read_bytes())
    with pytest.raises(IndexFormatError, match=rf"s3://{BUCKET}/nocol/index.offset.npy holds <u4") as e5:
        EpisodeIndex.open(f"s3://{BUCKET}/nocol")
    c.put_object(Bucket=BUCKET, Key="nocol/index.offset.npy",
                 Body=(shards / "index.offset.npy").read_bytes() + b"\0" * 8)  # a column with bytes after its data
    with pytest.raises(IndexFormatError, match=rf"s3://{BUCKET}/nocol/index.offset.npy holds"):
        EpisodeIndex.open(f"s3://{BUCKET}/nocol")
    errors = (e1, e2, e3, e4, e5)
    s3_secrets_absent(caplog.text, *(str(e.value) for e in errors), repr(EpisodeIndex.open(URL).source))


def test_a_version_1_index_opens_from_s3_too(moto, shards, proxy, tmp_path):
    v1 = as_v1(make_shards(tmp_path / "v1", shard_size=20_000, **SHAPE))
    moto.upload_dir(v1, BUCKET, "old")
    remote = EpisodeIndex.open(f"s3://{BUCKET}/old")
    assert remote.version == 1 and remote.data == EpisodeIndex.open(v1).data
    kw = dict(episodes=["ep0000", "ep0004"], batch_size=4, max_batches=10)
    assert plain(video_pipe(remote, **kw)) == plain(video_pipe(v1, **kw))


def test_a_shards_runs_are_fetched_together_and_in_bounded_batches(shards, proxy, monkeypatch):
    from episodepipes.remote import RemoteOptions

    index = EpisodeIndex.open(URL, options=RemoteOptions(waste=None))  # the gap alone merges a shard's runs
    kw = dict(split="train", frames_per_episode=4, batch_size=4, rank=0, world_size=1)
    pipe = metric_pipe(index, **kw)
    runs = read_runs(index, metric_items(index.split("train"), 4))  # the reader's plan: runs of adjacent frames
    assert len(runs) > len({r.shard for r in runs})  # some shard holds several runs
    proxy.reset()
    got = plain(pipe)
    assert len(proxy.gets()) == len({r.shard for r in runs})  # a shard's runs in one read: one coalesced GET
    proxy.reset()
    monkeypatch.setattr(ShardReader, "BATCH_BYTES", 1)  # a batch per run: the same frames, a GET per run
    assert plain(metric_pipe(index, **kw)) == got and len(proxy.gets()) == len(runs)


def test_h264_shards_read_from_s3_as_locally(moto, proxy, tmp_path):
    src = write_raw(tmp_path / "src", SyntheticReader(num_episodes=6, length=9, height=48, width=64))
    out = tmp_path / "h264"
    assert main(["write", str(src), str(out), "--workers", "1", "--shard-size", "30kB", "--codec", "h264",
                 "--gop", "4"]) == 0
    assert len(EpisodeIndex.open(out).shards) > 1  # GOPs straddle shards: earlier packets come from another one
    moto.upload_dir(out, BUCKET, "h264")
    url = f"s3://{BUCKET}/h264"
    video = dict(episodes=["ep0001", "ep0004"], batch_size=4, max_batches=100)
    assert plain(video_pipe(url, **video)) == plain(video_pipe(out, **video))
    metric = dict(frames_per_episode=3, batch_size=2, split="train", rank=0, world_size=1)  # mid-GOP frames
    assert plain(metric_pipe(url, **metric)) == plain(metric_pipe(out, **metric))


def test_a_sparse_metric_plan_costs_at_most_1_1x_its_bytes(moto, proxy, tmp_path):
    from episodepipes.remote import RemoteOptions

    big = make_shards(tmp_path / "big", shard_size=1 << 20, **SHAPE)  # one shard: the chosen frames lie close
    moto.upload_dir(big, BUCKET, "sparse")
    kw = dict(split="train", frames_per_episode=3, batch_size=4, rank=0, world_size=1)
    local = metric_pipe(big, **kw)
    want = plain(local)
    for options, most in ((RemoteOptions(waste=None), None), (RemoteOptions(), 1.1)):
        index = EpisodeIndex.open(f"s3://{BUCKET}/sparse", options=options)
        proxy.reset()
        assert plain(metric_pipe(index, **kw)) == want
        ratio = proxy.body_bytes / local.stats["bytes_read"]
        if most is None:
            assert ratio > 1.5  # the gap alone reads through the unplanned frames between the chosen ones
        else:
            assert ratio <= most


def test_train_pipe_fetches_each_batch_at_once_and_the_next_ones_ahead(shards, proxy):
    from s3server import Faults

    kw = dict(batch_size=4, seed=5, rank=0, world_size=1, num_workers=2)
    local = plain(train_pipe(shards, **kw))
    index = EpisodeIndex.open(URL)
    proxy.reset(Faults(latency=0.05))  # long enough for a batch's GETs, and the next batches', to overlap
    assert plain(train_pipe(index, **kw)) == local
    assert proxy.peak > 4  # more than one batch's frames in flight: the read-ahead
