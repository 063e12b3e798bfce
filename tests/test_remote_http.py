"""Every pipe, the index and the CLI on an ``http(s)://`` root (a range-capable static server on 127.0.0.1)
yield what they do locally; plain HTTP is allowed to loopback hosts only, unless asked for."""

from __future__ import annotations

import shutil
import time

import pytest
import torch
from helpers import make_shards
from httpserver import RangeServer

from episodepipes.format import COLUMNS
from episodepipes.index import EpisodeIndex
from episodepipes.pipes import metric_pipe, video_pipe
from episodepipes.pipes.train import train_pipe
from episodepipes.remote import RemoteOptions, RemoteSource
from episodepipes.remote.endpoint import is_loopback
from episodepipes.sharding.cli import main
from episodepipes.shardio import ShardIOError, ShardMissingError

SHAPE = dict(num_episodes=6, lengths=(12, 7, 5, 9, 11, 4), height=16, width=24)
WINDOWS = dict(history={"state": 3, "front": 2}, horizon={"action": 4})


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """(the local shards, the server) with the shards served under ``/data/v1/``."""
    base = tmp_path_factory.mktemp("http")
    out = make_shards(base / "shards", shard_size=20_000, **SHAPE)
    shutil.copytree(out, base / "www" / "data" / "v1")
    server = RangeServer(base / "www")
    yield out, server
    server.close()


@pytest.fixture
def served(site):
    """(local shards, the server with its counters reset, the root URL)."""
    out, server = site
    server.reset()
    return out, server, f"{server.endpoint}/data/v1"


def _plain(batches) -> list[dict]:
    return [{k: (str(v.dtype), tuple(v.shape), v.numpy().tobytes()) if torch.is_tensor(v) else v
             for k, v in sorted(b.items())} for b in batches]


def test_the_index_opens_over_http_as_it_does_locally(served):
    shards, server, url = served
    local, remote = EpisodeIndex.open(shards), EpisodeIndex.open(url + "/")
    assert remote.remote and remote.root == url
    assert remote.data == local.data and remote.fingerprint == local.fingerprint and remote.version == 2
    assert [p for _, p, _ in server.gets()] == [f"/data/v1/{n}" for n in
                                                ["index.json", *(COLUMNS[c][0] for c in remote.meta["columns"])]]
    server.reset()
    remote.verify()
    columns = sum((shards / COLUMNS[c][0]).stat().st_size for c in local.meta["columns"])
    assert server.body_bytes == sum(s.bytes for s in local.shards) + columns


@pytest.mark.parametrize("method", ["thread", "process"])
def test_metric_pipe_yields_what_it_yields_locally(served, method):
    shards, server, url = served
    kw = dict(frames_per_episode=5, batch_size=3, rank=0, world_size=1, num_workers=2, method=method)
    remote = metric_pipe(url, split="train", **kw)
    got = _plain(remote)
    assert got == _plain(metric_pipe(shards, split="train", **kw)) and len(got) == len(remote)
    assert any(r is not None and r.startswith("bytes=") for _, _, r in server.gets())


def test_video_pipe_yields_what_it_yields_locally_and_a_pinned_episode_costs_its_own_bytes(served):
    shards, server, url = served
    index = EpisodeIndex.open(url)
    ep = index.episode("ep0000")
    assert len({seg.shard for seg in ep.segments}) > 1
    kw = dict(episodes=["ep0000"], batch_size=4, max_batches=10)
    server.reset()
    got = _plain(video_pipe(index, **kw))
    assert got == _plain(video_pipe(shards, **kw)) and sum(b["frame"][1][0] for b in got) == ep.length
    assert 0 < server.body_bytes <= 1.1 * ep.nbytes  # counted by the server, on what it sent
    assert all(r is not None for _, _, r in server.gets())


@pytest.mark.parametrize("method", ["thread", "process"])
def test_train_pipe_yields_what_it_yields_locally(served, method):
    shards, server, url = served
    kw = dict(batch_size=4, seed=3, rank=0, world_size=1, epochs=2, num_workers=2, method=method, **WINDOWS)
    remote = train_pipe(url, **kw)
    got = _plain(remote)
    assert got == _plain(train_pipe(shards, **kw)) and len(got) == len(remote)


def test_a_closed_gate_sends_no_request(served):
    _, server, url = served
    index = EpisodeIndex.open(url)
    server.reset()
    pipe = video_pipe(index, episodes=["ep0001", "ep0003"], batch_size=2, max_batches=4, gate=lambda: False)
    assert list(pipe) == [] and list(pipe) == [] and len(pipe) == 4
    assert server.requests == []
    assert len(list(video_pipe(index, episodes=["ep0001"], batch_size=2, max_batches=4))) == 4
    assert server.gets()


def test_a_missing_object_is_named(served, tmp_path):
    shards, server, url = served
    gone = server.root / "data" / "gone"
    shutil.copytree(shards, gone)
    index = EpisodeIndex.open(f"{server.endpoint}/data/gone")
    shard = index.shards[index.episode("ep0000").segments[0].shard].name
    (gone / shard).unlink()
    root = f"{server.endpoint}/data/gone"
    with pytest.raises(ShardMissingError, match=rf"^{root}/{shard} is missing; upload it"):
        list(video_pipe(index, episodes=["ep0000"], batch_size=4, max_batches=10))
    with pytest.raises(FileNotFoundError, match=rf"{root}/{shard} is missing"):
        list(train_pipe(index, batch_size=4, seed=0, rank=0, world_size=1))
    with pytest.raises(FileNotFoundError, match=rf"no index.json at {server.endpoint}/data/nothing-here"):
        EpisodeIndex.open(f"{server.endpoint}/data/nothing-here")
    with pytest.raises(ShardIOError, match=rf"{url}/{shard} ends at byte \d+, the index expects"):
        RemoteSource(url).read(shard, 10**9, 10)


def test_cli_info_and_verify_read_an_http_root(served, capsys):
    shards, server, url = served
    assert main(["info", url]) == 0
    out = capsys.readouterr().out
    assert f"output    {url}" in out and "episodes  6" in out
    assert main(["verify", url]) == 0
    assert capsys.readouterr().out.strip() == f"{url}: ok"
    cut = server.root / "data" / "cut"
    shutil.copytree(shards, cut)
    index = EpisodeIndex.open(shards)
    name = index.shards[1].name
    (cut / name).write_bytes((shards / name).read_bytes()[:-700])
    (cut / index.shards[0].name).unlink()
    assert main(["verify", f"{server.endpoint}/data/cut"]) == 1
    err = capsys.readouterr().err
    assert f"shard {index.shards[0].name} is missing" in err and f"shard {name} has" in err
    assert main(["info", f"{server.endpoint}/data/nothing-here"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"no index.json at {server.endpoint}/data/nothing-here" in err


def test_plain_http_to_a_host_off_this_machine_is_refused_unless_allowed(monkeypatch):
    t0 = time.monotonic()
    with pytest.raises(ShardIOError, match=r"root http://10\.11\.12\.13:8000/data is plain http:// to 10\.11\.12\.13: "
                                           r".*unencrypted; use https://, or pass RemoteOptions\(allow_http=True\)"):
        RemoteSource("http://10.11.12.13:8000/data").read("index.json", 0, 10)
    for k, v in {"AWS_ENDPOINT_URL": "http://minio.internal:9000", "AWS_ACCESS_KEY_ID": "AKIA0000",
                 "AWS_SECRET_ACCESS_KEY": "not-sent-anywhere"}.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ShardIOError, match=r"AWS_ENDPOINT_URL is plain http:// to minio\.internal") as e:
        RemoteSource("s3://bucket/prefix").size("shard-000000.tar")
    assert "not-sent-anywhere" not in str(e.value)
    monkeypatch.setenv("GOOGLE_BASE_URL", "http://gcs.internal")
    with pytest.raises(ShardIOError, match=r"GOOGLE_BASE_URL is plain http:// to gcs\.internal"):
        RemoteSource("gs://bucket/prefix").size("shard-000000.tar")
    assert time.monotonic() - t0 < 2  # refused before connecting: no time-outs spent
    for root in ("http://10.11.12.13:8000/data", "s3://bucket/prefix", "gs://bucket/prefix"):  # asked for: a client
        RemoteSource(root, RemoteOptions(allow_http=True))._client()
    RemoteSource("https://example.org/data")._client()  # https needs no permission
    with pytest.raises(ValueError, match="allow_http"):
        RemoteOptions(allow_http="yes")


def test_loopback_hosts_are_recognised_by_name_without_resolving():
    assert all(map(is_loopback, ["127.0.0.1", "127.8.9.10", "::1", "localhost", "LOCALHOST.", "a.localhost"]))
    assert not any(map(is_loopback, ["10.0.0.1", "0.0.0.0", "example.org", "localhost.example.org", "", None,
                                     "127.0.0.1.nip.io"]))


def test_the_server_answers_ranges_as_http_says(site):
    """The test server itself: what a range-capable origin answers (so the tests above test the client)."""
    import http.client

    shards, server = site
    name = sorted(p.name for p in shards.glob("shard-*.tar"))[0]
    data = (shards / name).read_bytes()
    conn = http.client.HTTPConnection("127.0.0.1", int(server.endpoint.rsplit(":", 1)[1]), timeout=5)
    for rng, status, body in ((None, 200, data), ("bytes=10-19", 206, data[10:20]), ("bytes=-5", 206, data[-5:]),
                              (f"bytes={len(data) - 3}-", 206, data[-3:]), (f"bytes={len(data)}-", 416, b"")):
        conn.request("GET", f"/data/v1/{name}", headers={"Range": rng} if rng else {})
        r = conn.getresponse()
        assert (r.status, r.read()) == (status, body)
        assert status == 416 or r.getheader("ETag")
        assert r.getheader("Content-Range", "").endswith(f"/{len(data)}") == (status != 200)
    conn.request("HEAD", f"/data/v1/{name}")
    r = conn.getresponse()
    assert (r.status, r.read(), r.getheader("Content-Length")) == (200, b"", str(len(data)))
    for bad in ("/data/v1/../v1/" + name, "/data//v1/" + name, "/data/v1/nope.tar"):
        conn.request("GET", bad)
        r = conn.getresponse()
        assert (r.status, r.read()) == (404, b"not found")
    conn.close()
