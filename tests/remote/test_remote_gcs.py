"""Every pipe, the index, the CLI and `write` on a ``gs://`` root (fake-gcs-server behind a counting proxy),
with only the standard GCS environment set (``GOOGLE_APPLICATION_CREDENTIALS``, ``GOOGLE_BASE_URL``)."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from urllib.parse import unquote

import pytest
from gcsserver import CLIENT_EMAIL, PRIVATE_KEY_ID
from remotecases import plain

from episodepipes.index import EpisodeIndex
from episodepipes.pipes import video_pipe
from episodepipes.pipes.train import train_pipe
from episodepipes.remote import RemoteOptions
from episodepipes.remote.store import RemoteStore
from episodepipes.sharding.cli import main
from episodepipes.sharding.formats.synthetic import SyntheticReader
from episodepipes.sharding.write import WriteOptions, write_shards
from episodepipes.shardio import ShardIOError

BUCKET = "episodes"
SHAPE = dict(num_episodes=6, lengths=(12, 7, 5, 9, 11, 4), height=16, width=24)
WINDOWS = dict(history={"state": 3, "front": 2}, horizon={"action": 4})
URL = f"gs://{BUCKET}/v1"


@pytest.fixture(scope="module")
def shards(gcs, shard_folder) -> Path:
    out = shard_folder("gcs-pipes", shard_size=20_000, **SHAPE)
    gcs.upload_dir(out, BUCKET, "v1")
    return out


def test_requests_are_signed_with_the_application_default_credentials(shards, gcs, gcs_proxy):
    gcs.shim.authorization.clear()
    assert EpisodeIndex.open(URL).data == EpisodeIndex.open(shards).data
    assert gcs.shim.authorization and all(a and a.startswith("Bearer ") for a in gcs.shim.authorization)
    header, claims, _ = gcs.shim.authorization[0].split(" ", 1)[1].split(".")
    pad = lambda s: base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))  # noqa: E731
    assert json.loads(pad(header))["kid"] == PRIVATE_KEY_ID  # a JWT signed with the service account's key
    assert json.loads(pad(claims))["iss"] == CLIENT_EMAIL


def test_storage_emulator_host_alone_reads_anonymously_from_the_emulator(shards, gcs, gcs_proxy, monkeypatch):
    for k in ("GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_BASE_URL"):
        monkeypatch.delenv(k)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_proxy.endpoint.removeprefix("http://"))  # host:port, as gcloud
    gcs.shim.authorization.clear()
    kw = dict(episodes=["ep0002"], batch_size=4, max_batches=10)
    assert plain(video_pipe(URL, **kw)) == plain(video_pipe(shards, **kw))
    assert gcs_proxy.gets() and gcs.shim.authorization and not any(gcs.shim.authorization)  # unsigned


def test_obstores_emulator_service_account_file_reads_with_allow_http(shards, gcs, gcs_proxy, monkeypatch, tmp_path):
    for k in ("GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_BASE_URL"):
        monkeypatch.delenv(k)
    emulator = tmp_path / "emulator.json"  # the endpoint is in the file, where the allow_http check cannot see it
    emulator.write_text(json.dumps({"gcs_base_url": gcs_proxy.endpoint, "disable_oauth": True, "client_email": "",
                                    "private_key": "", "private_key_id": ""}))
    monkeypatch.setenv("GOOGLE_SERVICE_ACCOUNT", str(emulator))
    index = EpisodeIndex.open(URL, options=RemoteOptions(allow_http=True))
    assert index.data == EpisodeIndex.open(shards).data and gcs_proxy.gets()
    gcs_proxy.reset()
    with pytest.raises(ShardIOError, match=rf"^{URL}/index.json: "):  # https only, by default
        EpisodeIndex.open(URL, options=RemoteOptions(attempts=1))
    assert gcs_proxy.requests == []


def test_the_index_opens_from_gcs_as_it_does_locally(shards, gcs_proxy):
    local, remote = EpisodeIndex.open(shards), EpisodeIndex.open(URL + "/")
    gets = gcs_proxy.gets()
    assert [p for _, p, _ in gets][0] == f"/{BUCKET}/v1%2Findex%2Ejson"  # its size first (HEAD), then its bytes
    assert gets[0][2] == f"bytes=0-{(shards / 'index.json').stat().st_size - 1}"
    assert all(r is not None and r.startswith("bytes=0-") for _, _, r in gets)  # each file in one GET from byte 0
    assert len(gets) == 1 + len(local.meta["columns"])  # the per-frame columns' headers only: rows come on use
    assert remote.remote and remote.root == URL
    assert remote.data == local.data and remote.fingerprint == local.fingerprint and remote.version == 2
    gcs_proxy.reset()
    remote.verify()  # every column's and shard's bytes through the source, checked against their digests
    columns = sum(p.stat().st_size for p in shards.glob("index.*.npy"))
    assert gcs_proxy.body_bytes == sum(s.bytes for s in local.shards) + columns


def test_a_write_to_gcs_puts_the_local_objects_index_last_and_reads_back(gcs, gcs_proxy, tmp_path):
    gcs.create_bucket(BUCKET)
    opts = WriteOptions(format="test", shard_size=20_000)
    local = tmp_path / "local"
    write_shards(SyntheticReader(**SHAPE), local, opts)
    url = f"gs://{BUCKET}/written"
    res = write_shards(SyntheticReader(**SHAPE), url, opts, staging=tmp_path / "stage")
    assert res.out == url and res.shards == len(EpisodeIndex.open(local).shards) > 2
    files = sorted(p.name for p in local.iterdir())
    assert gcs.names(BUCKET, "written") == files  # no progress file left behind
    assert all(gcs.get(BUCKET, f"written/{n}") == (local / n).read_bytes() for n in files)
    puts = [unquote(p.rsplit("%2F", 1)[1]) for _, p, _ in gcs_proxy.puts()]
    objects = [n for n in puts if not n.startswith("_progress.")]  # the resume records, deleted at the end
    assert sorted(objects) == files and objects[-1] == "index.json"  # each object once, the index last
    kw = dict(batch_size=4, seed=1, rank=0, world_size=1, **WINDOWS)
    assert plain(train_pipe(url, **kw)) == plain(train_pipe(local, **kw))
    assert main(["verify", url]) == 0


def test_jobs_write_to_a_gcs_out_merge_there_and_an_interrupted_write_resumes(gcs, gcs_proxy, tmp_path):
    from helpers import write_raw
    from s3server import Faults

    gcs.create_bucket(BUCKET)
    src = write_raw(tmp_path / "src", SyntheticReader(**SHAPE))
    ref = tmp_path / "ref"
    assert main(["write", str(src), str(ref), "--shard-size", "20000", "--workers", "1"]) == 0
    files = sorted(p.name for p in ref.iterdir())
    url = f"gs://{BUCKET}/jobs"
    base = ["write", str(src), url, "--shard-size", "20000", "--workers", "1", "--num-jobs", "2"]
    for job in (0, 1):
        assert main([*base, "--job-index", str(job), "--staging", str(tmp_path / f"m{job}")]) == 0
    assert any(n.startswith("_jobs/job-0001/shard-") for n in gcs.names(BUCKET, "jobs"))
    assert main(["merge", url, "--staging", str(tmp_path / "m")]) == 0  # lists, copies up, deletes the jobs' objects
    assert gcs.names(BUCKET, "jobs") == files
    assert all(gcs.get(BUCKET, f"jobs/{n}") == (ref / n).read_bytes() for n in files)
    RemoteStore(url).delete(["nothing-here.tar", "_jobs/nothing-here.tar"])  # missing objects: no error, as on S3

    url = f"gs://{BUCKET}/resumed"
    opts = WriteOptions(format="test", shard_size=20_000)
    gcs_proxy.reset(Faults(puts_ok=4))  # progress, shard 0, progress, shard 1: then every PUT is refused
    with pytest.raises(ShardIOError, match=rf"{url}/_progress.json: failed after 5 attempts"):
        write_shards(SyntheticReader(**SHAPE), url, opts, staging=tmp_path / "a")
    assert "index.json" not in gcs.names(BUCKET, "resumed")
    gcs_proxy.reset()
    res = write_shards(SyntheticReader(**SHAPE), url, opts, staging=tmp_path / "b")
    assert res.resumed and 0 < res.frames_written < res.frames
    local = tmp_path / "local"
    write_shards(SyntheticReader(**SHAPE), local, opts)
    assert [gcs.get(BUCKET, f"resumed/{n}") for n in gcs.names(BUCKET, "resumed")] == \
        [(local / n).read_bytes() for n in sorted(p.name for p in local.iterdir())]
