"""Every pipe, the index and the CLI on an S3 root (moto behind a counting proxy) yield what they do locally."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from helpers import as_v1, make_shards, write_raw
from s3server import CREDENTIALS

from episodepipes.format import COLUMNS
from episodepipes.index import EpisodeIndex, IndexFormatError
from episodepipes.pipes import metric_pipe, video_pipe
from episodepipes.pipes.plan import metric_items, read_runs
from episodepipes.pipes.read import ShardReader
from episodepipes.pipes.train import train_pipe
from episodepipes.sharding.cli import main
from episodepipes.sharding.synthetic import SyntheticReader
from episodepipes.shardio import ShardMissingError

BUCKET = "pipes"
SHAPE = dict(num_episodes=6, lengths=(12, 7, 5, 9, 11, 4), height=16, width=24)
WINDOWS = dict(history={"state": 3, "front": 2}, horizon={"action": 4})


@pytest.fixture(scope="module")
def shards(moto, tmp_path_factory) -> Path:
    out = make_shards(tmp_path_factory.mktemp("remote-pipes") / "s", shard_size=20_000, **SHAPE)
    moto.upload_dir(out, BUCKET, "v1")
    return out


URL = f"s3://{BUCKET}/v1"


def _plain(batches) -> list[dict]:
    """Batches as comparable values: every tensor's dtype, shape and bytes, every list as it is."""
    out = []
    for b in batches:
        out.append({k: (str(v.dtype), tuple(v.shape), v.numpy().tobytes()) if torch.is_tensor(v) else v
                    for k, v in sorted(b.items())})
    return out


def _secrets_absent(*texts: str) -> None:
    for t in texts:
        for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            assert CREDENTIALS[k] not in t


def test_the_index_opens_from_s3_as_it_does_locally(shards, proxy):
    local, remote = EpisodeIndex.open(shards), EpisodeIndex.open(URL + "/")
    assert remote.remote and not local.remote and remote.root == URL
    assert remote.data == local.data and remote.fingerprint == local.fingerprint
    assert remote.version == 2  # the index.json, then each of its columns: its size (HEAD), then one GET of those bytes
    files = ["index.json", *(COLUMNS[c][0] for c in remote.meta["columns"])]
    assert [r[1] for r in proxy.gets()] == [f"/{BUCKET}/v1/{n}" for n in files]
    assert [r[1] for r in proxy.requests if r[0] == "HEAD"] == [f"/{BUCKET}/v1/{n}" for n in files]
    assert [rng for _, _, rng in proxy.gets()] == [f"bytes=0-{(shards / n).stat().st_size - 1}" for n in files]
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
    _secrets_absent(caplog.text, *(str(e.value) for e in errors), repr(EpisodeIndex.open(URL).source))


def test_a_version_1_index_opens_from_s3_too(moto, shards, proxy, tmp_path):
    v1 = as_v1(make_shards(tmp_path / "v1", shard_size=20_000, **SHAPE))
    moto.upload_dir(v1, BUCKET, "old")
    remote = EpisodeIndex.open(f"s3://{BUCKET}/old")
    assert remote.version == 1 and remote.data == EpisodeIndex.open(v1).data
    kw = dict(episodes=["ep0000", "ep0004"], batch_size=4, max_batches=10)
    assert _plain(video_pipe(remote, **kw)) == _plain(video_pipe(v1, **kw))


@pytest.mark.parametrize("method", ["thread", "process"])
def test_metric_pipe_yields_what_it_yields_locally(shards, proxy, method):
    kw = dict(frames_per_episode=5, batch_size=3, rank=0, world_size=1, num_workers=2, method=method)
    local = _plain(metric_pipe(shards, split="train", **kw))
    remote = metric_pipe(URL, split="train", **kw)
    got = _plain(remote)
    assert got == local and len(got) == len(remote)
    assert remote.stats["bytes_read"] > 0 and len(proxy.gets()) > 1


def test_a_shards_runs_are_fetched_together_and_in_bounded_batches(shards, proxy, monkeypatch):
    from episodepipes.remote import RemoteOptions

    index = EpisodeIndex.open(URL, options=RemoteOptions(waste=None))  # the gap alone merges a shard's runs
    kw = dict(split="train", frames_per_episode=4, batch_size=4, rank=0, world_size=1)
    pipe = metric_pipe(index, **kw)
    runs = read_runs(index, metric_items(index.split("train"), 4))  # the reader's plan: runs of adjacent frames
    assert len(runs) > len({r.shard for r in runs})  # some shard holds several runs
    proxy.reset()
    got = _plain(pipe)
    assert len(proxy.gets()) == len({r.shard for r in runs})  # a shard's runs in one read: one coalesced GET
    proxy.reset()
    monkeypatch.setattr(ShardReader, "BATCH_BYTES", 1)  # a batch per run: the same frames, a GET per run
    assert _plain(metric_pipe(index, **kw)) == got and len(proxy.gets()) == len(runs)


def test_video_pipe_yields_what_it_yields_locally_and_a_pinned_episode_costs_its_own_bytes(shards, proxy):
    index = EpisodeIndex.open(URL)
    ep = index.episode("ep0000")
    assert len({seg.shard for seg in ep.segments}) > 1  # it spans shards
    kw = dict(episodes=["ep0000"], batch_size=4, max_batches=10)
    proxy.reset()
    got = _plain(video_pipe(index, **kw))
    assert got == _plain(video_pipe(shards, **kw))
    assert sum(b["frame"][1][0] for b in got) == ep.length  # every frame once
    assert 0 < proxy.body_bytes <= 1.1 * ep.nbytes


def test_a_closed_gate_sends_no_request(shards, proxy):
    index = EpisodeIndex.open(URL)
    proxy.reset()
    pipe = video_pipe(index, episodes=["ep0001", "ep0003"], batch_size=2, max_batches=4, gate=lambda: False)
    assert list(pipe) == [] and list(pipe) == [] and len(pipe) == 4
    assert proxy.requests == []
    assert len(list(video_pipe(index, episodes=["ep0001"], batch_size=2, max_batches=4))) == 4
    assert proxy.gets()


@pytest.mark.parametrize("method", ["thread", "process"])
def test_train_pipe_yields_what_it_yields_locally(shards, proxy, method):
    kw = dict(batch_size=4, seed=3, rank=0, world_size=1, epochs=2, num_workers=2, method=method, **WINDOWS)
    local = _plain(train_pipe(shards, **kw))
    remote = train_pipe(URL, **kw)
    got = _plain(remote)
    assert got == local and len(got) == len(remote) == len(local)


def test_a_missing_shard_object_is_named(moto, shards, proxy):
    moto.upload_dir(shards, BUCKET, "gone")
    index = EpisodeIndex.open(f"s3://{BUCKET}/gone")
    shard = index.shards[index.episode("ep0000").segments[0].shard].name
    moto.client().delete_object(Bucket=BUCKET, Key=f"gone/{shard}")
    with pytest.raises(ShardMissingError, match=rf"s3://{BUCKET}/gone/{shard} is missing"):
        list(video_pipe(index, episodes=["ep0000"], batch_size=4, max_batches=10))
    with pytest.raises(FileNotFoundError, match=rf"s3://{BUCKET}/gone/{shard} is missing"):
        list(train_pipe(index, batch_size=4, seed=0, rank=0, world_size=1))
    with pytest.raises(FileNotFoundError, match=rf"s3://{BUCKET}/gone: shard {shard} is missing"):
        index.verify()


def test_cli_info_and_verify_read_a_remote_root(moto, shards, proxy, capsys):
    assert main(["info", URL]) == 0
    out = capsys.readouterr().out
    assert f"output    {URL}" in out and "episodes  6" in out
    assert main(["verify", URL]) == 0
    assert capsys.readouterr().out.strip() == f"{URL}: ok"
    moto.upload_dir(shards, BUCKET, "cut")
    index = EpisodeIndex.open(shards)
    name = index.shards[1].name
    moto.client().put_object(Bucket=BUCKET, Key=f"cut/{name}", Body=(shards / name).read_bytes()[:-700])
    moto.client().delete_object(Bucket=BUCKET, Key=f"cut/{index.shards[0].name}")
    assert main(["verify", f"s3://{BUCKET}/cut"]) == 1
    cap = capsys.readouterr()
    assert f"shard {index.shards[0].name} is missing" in cap.err and f"shard {name} has" in cap.err
    assert "FAILED" in cap.out
    assert main(["info", f"s3://{BUCKET}/nothing-here"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"no index.json at s3://{BUCKET}/nothing-here" in err
    _secrets_absent(out, cap.err, err)


def test_h264_shards_read_from_s3_as_locally(moto, proxy, tmp_path):
    src = write_raw(tmp_path / "src", SyntheticReader(num_episodes=6, length=9, height=48, width=64))
    out = tmp_path / "h264"
    assert main(["write", str(src), str(out), "--workers", "1", "--shard-size", "30kB", "--codec", "h264",
                 "--gop", "4"]) == 0
    assert len(EpisodeIndex.open(out).shards) > 1  # GOPs straddle shards: earlier packets come from another one
    moto.upload_dir(out, BUCKET, "h264")
    url = f"s3://{BUCKET}/h264"
    video = dict(episodes=["ep0001", "ep0004"], batch_size=4, max_batches=100)
    assert _plain(video_pipe(url, **video)) == _plain(video_pipe(out, **video))
    metric = dict(frames_per_episode=3, batch_size=2, split="train", rank=0, world_size=1)  # mid-GOP frames
    assert _plain(metric_pipe(url, **metric)) == _plain(metric_pipe(out, **metric))


def test_a_sparse_metric_plan_costs_at_most_1_1x_its_bytes(moto, proxy, tmp_path):
    from episodepipes.remote import RemoteOptions

    big = make_shards(tmp_path / "big", shard_size=1 << 20, **SHAPE)  # one shard: the chosen frames lie close
    moto.upload_dir(big, BUCKET, "sparse")
    kw = dict(split="train", frames_per_episode=3, batch_size=4, rank=0, world_size=1)
    local = metric_pipe(big, **kw)
    want = _plain(local)
    for options, most in ((RemoteOptions(waste=None), None), (RemoteOptions(), 1.1)):
        index = EpisodeIndex.open(f"s3://{BUCKET}/sparse", options=options)
        proxy.reset()
        assert _plain(metric_pipe(index, **kw)) == want
        ratio = proxy.body_bytes / local.stats["bytes_read"]
        if most is None:
            assert ratio > 1.5  # the gap alone reads through the unplanned frames between the chosen ones
        else:
            assert ratio <= most


def test_train_pipe_fetches_each_batch_at_once_and_the_next_ones_ahead(shards, proxy):
    from s3server import Faults

    kw = dict(batch_size=4, seed=5, rank=0, world_size=1, num_workers=2)
    local = _plain(train_pipe(shards, **kw))
    index = EpisodeIndex.open(URL)
    proxy.reset(Faults(latency=0.05))  # long enough for a batch's GETs, and the next batches', to overlap
    assert _plain(train_pipe(index, **kw)) == local
    assert proxy.peak > 4  # more than one batch's frames in flight: the read-ahead
