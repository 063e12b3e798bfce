"""Every pipe, the index and the CLI on an ``http(s)://`` root (a range-capable static server on 127.0.0.1)
yield what they do locally; plain HTTP is allowed to loopback hosts only, unless asked for."""

from __future__ import annotations

import shutil
import time

import pytest
from helpers import make_shards
from httpserver import RangeServer

from episodepipes.format import COLUMNS
from episodepipes.index import EpisodeIndex
from episodepipes.remote import RemoteOptions, RemoteSource
from episodepipes.remote.endpoint import is_loopback
from episodepipes.shardio import ShardIOError

SHAPE = dict(num_episodes=6, lengths=(12, 7, 5, 9, 11, 4), height=16, width=24)


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


def test_the_index_opens_over_http_as_it_does_locally(served):
    shards, server, url = served
    local, remote = EpisodeIndex.open(shards), EpisodeIndex.open(url + "/")
    assert [p for _, p, _ in server.gets()] == [f"/data/v1/{n}" for n in  # one GET each at open
                                                ["index.json", *(COLUMNS[c][0] for c in remote.meta["columns"])]]
    assert remote.remote and remote.root == url
    assert remote.data == local.data and remote.fingerprint == local.fingerprint and remote.version == 2
    server.reset()
    remote.verify()
    columns = sum((shards / COLUMNS[c][0]).stat().st_size for c in local.meta["columns"])
    assert server.body_bytes == sum(s.bytes for s in local.shards) + columns


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
