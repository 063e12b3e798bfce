"""Every pipe and the CLI on each remote root kind (``s3://`` on moto, ``gs://`` on fake-gcs-server, both behind a
counting proxy; ``http://`` on a range-capable static server on 127.0.0.1) yield what they do locally, fetch only
what they read, and name a missing object without leaking a secret. Each check is written once, for every kind."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
from httpserver import RangeServer
from remotecases import Root, gcs_root, http_root, plain, s3_root

from episodepipes.index import EpisodeIndex
from episodepipes.pipes import metric_pipe, video_pipe
from episodepipes.pipes.train import train_pipe
from episodepipes.remote import RemoteSource
from episodepipes.sharding.cli import main
from episodepipes.shardio import ShardIOError, ShardMissingError

SHAPE = dict(num_episodes=6, lengths=(12, 7, 5, 9, 11, 4), height=16, width=24)
WINDOWS = dict(history={"state": 3, "front": 2}, horizon={"action": 4})


@pytest.fixture(scope="module")
def shards(shard_folder) -> Path:
    return shard_folder("roots", shard_size=20_000, **SHAPE)


@pytest.fixture(scope="module")
def site(shards, tmp_path_factory):
    """A static server with the shards under ``/data/v1/``."""
    www = tmp_path_factory.mktemp("www")
    shutil.copytree(shards, www / "data" / "v1")
    server = RangeServer(www)
    yield server
    server.close()


@pytest.fixture(scope="module")
def s3_v1(moto, shards) -> None:
    moto.upload_dir(shards, "pipes", "v1")


@pytest.fixture(scope="module")
def gs_v1(gcs, shards) -> None:
    gcs.upload_dir(shards, "episodes", "v1")


@pytest.fixture(params=["s3", "gs", "https"])
def root(request) -> Root:
    """The shards under the prefix ``v1`` of one root kind, its request counter reset."""
    kind = request.param
    if kind == "s3":
        request.getfixturevalue("s3_v1")
        r = s3_root(request.getfixturevalue("moto"), request.getfixturevalue("proxy"), "pipes")
    elif kind == "gs":
        request.getfixturevalue("gs_v1")
        r = gcs_root(request.getfixturevalue("gcs"), request.getfixturevalue("gcs_proxy"), "episodes")
    else:
        r = http_root(request.getfixturevalue("site"))
    r.counter.reset()
    return r


@pytest.mark.parametrize("method", ["thread", "process"])
def test_metric_pipe_yields_what_it_yields_locally(shards, root, method):
    kw = dict(frames_per_episode=5, batch_size=3, rank=0, world_size=1, num_workers=2, method=method)
    local = plain(metric_pipe(shards, split="train", **kw))
    remote = metric_pipe(root.url("v1"), split="train", **kw)
    got = plain(remote)
    assert got == local and len(got) == len(remote)
    gets = root.counter.gets()
    assert remote.stats["bytes_read"] > 0 and len(gets) > 1
    assert any(r is not None and r.startswith("bytes=") for _, _, r in gets)  # ranged GETs


def test_video_pipe_yields_what_it_yields_locally_and_a_pinned_episode_costs_its_own_bytes(shards, root):
    index = EpisodeIndex.open(root.url("v1"))
    ep = index.episode("ep0000")
    assert len({seg.shard for seg in ep.segments}) > 1  # it spans shards
    kw = dict(episodes=["ep0000"], batch_size=4, max_batches=10)
    root.counter.reset()
    got = plain(video_pipe(index, **kw))
    assert got == plain(video_pipe(shards, **kw))
    assert sum(b["frame"][1][0] for b in got) == ep.length  # every frame once
    assert 0 < root.counter.body_bytes <= 1.1 * ep.nbytes  # counted on what was sent
    assert all(r is not None for _, _, r in root.counter.gets())


@pytest.mark.parametrize("method", ["thread", "process"])
def test_train_pipe_yields_what_it_yields_locally(shards, root, method):
    kw = dict(batch_size=4, seed=3, rank=0, world_size=1, epochs=2, num_workers=2, method=method, **WINDOWS)
    local = plain(train_pipe(shards, **kw))
    remote = train_pipe(root.url("v1"), **kw)
    got = plain(remote)
    assert got == local and len(got) == len(remote) == len(local)


def test_a_closed_gate_sends_no_request(root):
    index = EpisodeIndex.open(root.url("v1"))
    root.counter.reset()
    pipe = video_pipe(index, episodes=["ep0001", "ep0003"], batch_size=2, max_batches=4, gate=lambda: False)
    assert list(pipe) == [] and list(pipe) == [] and len(pipe) == 4
    assert root.counter.requests == []
    assert len(list(video_pipe(index, episodes=["ep0001"], batch_size=2, max_batches=4))) == 4
    assert root.counter.gets()


def test_a_missing_object_is_named_without_secrets(shards, root, caplog):
    root.copy(shards, "gone")
    gone = root.url("gone")
    caplog.set_level(logging.DEBUG, logger=root.logger)
    index = EpisodeIndex.open(gone)
    shard = index.shards[index.episode("ep0000").segments[0].shard].name
    root.delete("gone", shard)
    with pytest.raises(ShardMissingError, match=rf"^{gone}/{shard} is missing; upload it") as e1:
        list(video_pipe(index, episodes=["ep0000"], batch_size=4, max_batches=10))
    with pytest.raises(FileNotFoundError, match=rf"{gone}/{shard} is missing") as e2:
        list(train_pipe(index, batch_size=4, seed=0, rank=0, world_size=1))
    with pytest.raises(FileNotFoundError, match=rf"{gone}: shard {shard} is missing") as e3:
        index.verify()
    with pytest.raises(FileNotFoundError, match=rf"no index.json at {root.url('nothing-here')}") as e4:
        EpisodeIndex.open(root.url("nothing-here"))
    with pytest.raises(ShardIOError, match=rf"{root.url('v1')}/{shard} ends at byte \d+, the index expects") as e5:
        RemoteSource(root.url("v1")).read(shard, 10**9, 10)
    errors = [e.value for e in (e1, e2, e3, e4, e5)]
    root.secrets_absent(caplog.text, *map(str, errors), *map(repr, errors), repr(index.source))


def test_cli_info_and_verify_read_a_remote_root(shards, root, capsys):
    url = root.url("v1")
    assert main(["info", url]) == 0
    out = capsys.readouterr().out
    assert f"output    {url}" in out and "episodes  6" in out
    assert main(["verify", url]) == 0
    assert capsys.readouterr().out.strip() == f"{url}: ok"
    root.copy(shards, "cut")
    index = EpisodeIndex.open(shards)
    name = index.shards[1].name
    root.put("cut", name, (shards / name).read_bytes()[:-700])
    root.delete("cut", index.shards[0].name)
    assert main(["verify", root.url("cut")]) == 1
    cap = capsys.readouterr()
    assert f"shard {index.shards[0].name} is missing" in cap.err and f"shard {name} has" in cap.err
    assert "FAILED" in cap.out
    assert main(["info", root.url("nothing-here")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"no index.json at {root.url('nothing-here')}" in err
    root.secrets_absent(out, cap.out, cap.err, err)
