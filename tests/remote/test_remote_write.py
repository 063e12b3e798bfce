"""`write` and `merge` to an S3 OUT (moto behind a fault-injecting proxy): the objects of a local write, index last."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import write_raw
from remotecases import plain, s3_secrets_absent
from s3server import CREDENTIALS, Faults

from episodepipes.index import EpisodeIndex
from episodepipes.pipes import metric_pipe, video_pipe
from episodepipes.pipes.train import train_pipe
from episodepipes.sharding.cli import main
from episodepipes.sharding.formats.synthetic import SyntheticReader
from episodepipes.sharding.write import WriteOptions, write_shards
from episodepipes.shardio import ShardIOError

BUCKET = "writes"
READER = dict(num_episodes=6, lengths=(12, 7, 5, 9, 11, 4), height=16, width=24)
OPTS = WriteOptions(format="test", shard_size=20_000)


@pytest.fixture(scope="module")
def bucket(moto):
    moto.client().create_bucket(Bucket=BUCKET)
    return moto


@pytest.fixture(scope="module")
def local(tmp_path_factory) -> Path:
    """The reference: the same source written to a local folder."""
    out = tmp_path_factory.mktemp("local") / "out"
    write_shards(SyntheticReader(**READER), out, OPTS)
    return out


def _objects(moto, prefix: str) -> dict[str, bytes]:
    c = moto.client()
    keys = [o["Key"] for o in c.list_objects_v2(Bucket=BUCKET, Prefix=prefix + "/").get("Contents", [])]
    return {k[len(prefix) + 1:]: c.get_object(Bucket=BUCKET, Key=k)["Body"].read() for k in keys}


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def test_a_write_to_s3_puts_the_local_objects_index_last_and_every_pipe_reads_them(bucket, local, proxy, tmp_path):
    url = f"s3://{BUCKET}/plain"
    res = write_shards(SyntheticReader(**READER), url, OPTS, staging=tmp_path / "stage")
    assert res.out == url and res.shards == len(EpisodeIndex.open(local).shards) > 2 and not res.resumed
    assert _objects(bucket, "plain") == _files(local)  # byte-identical, and no progress file left behind
    puts = [p.rsplit("/", 1)[1] for _, p, _ in proxy.puts()]
    shards = [n for n in puts if n.startswith("shard-")]
    assert shards == sorted(shards) and puts[-1] == "index.json"  # shards as they finish, the index last
    assert puts.index("index.json") > max(i for i, n in enumerate(puts) if n.startswith(("shard-", "index.")) and
                                          n != "index.json")
    assert not list((tmp_path / "stage").rglob("shard-*")) and not list((tmp_path / "stage").rglob("index*"))
    kw = dict(split="train", frames_per_episode=3, batch_size=4, rank=0, world_size=1)
    assert plain(metric_pipe(url, **kw)) == plain(metric_pipe(local, **kw))
    kw = dict(episodes=["ep0000", "ep0003"], batch_size=4, max_batches=10)
    assert plain(video_pipe(url, **kw)) == plain(video_pipe(local, **kw))
    kw = dict(batch_size=4, seed=1, rank=0, world_size=1)
    assert plain(train_pipe(url, **kw)) == plain(train_pipe(local, **kw))


class _Watching(SyntheticReader):
    """Records how many shard files the staging folder holds whenever an episode is read (workers=1: in-process)."""

    def __init__(self, stage: Path, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.stage, self.seen = stage, []

    def read(self, eid: str):  # noqa: ANN201
        self.seen.append(len(list(self.stage.rglob("shard-*.tar*"))))
        return super().read(eid)


def test_local_disk_holds_one_shard_at_a_time(bucket, local, proxy, tmp_path):
    reader = _Watching(tmp_path / "stage", **READER)
    write_shards(reader, f"s3://{BUCKET}/bounded", OPTS, staging=tmp_path / "stage")
    assert len(reader.seen) == READER["num_episodes"] and max(reader.seen) <= 1
    assert _objects(bucket, "bounded") == _files(local)


def test_puts_failing_mid_write_then_a_resume_on_another_machine_give_identical_objects(bucket, local, proxy,
                                                                                        tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger="episodepipes")
    url = f"s3://{BUCKET}/resumed"
    proxy.reset(Faults(puts_ok=4))  # progress, shard 0, progress, shard 1: then the store refuses every PUT
    with pytest.raises(ShardIOError, match=rf"{url}/_progress.json: failed after 5 attempts") as e:
        write_shards(SyntheticReader(**READER), url, OPTS, staging=tmp_path / "machine-a")
    got = _objects(bucket, "resumed")
    assert "index.json" not in got and "index.offset.npy" not in got  # no index before its shards
    assert [s["name"] for s in json.loads(got["_progress.json"])["shards"]] == ["shard-000000.tar"]
    assert [n for n in got if n.startswith("shard-")] == ["shard-000000.tar", "shard-000001.tar"]  # 1 unrecorded
    proxy.reset()
    res = write_shards(SyntheticReader(**READER), url, OPTS, staging=tmp_path / "machine-b")  # an empty staging
    assert res.resumed and 0 < res.frames_written < res.frames
    assert _objects(bucket, "resumed") == _files(local)
    shards_put = [p for _, p, _ in proxy.puts() if "/shard-" in p]
    assert f"/{BUCKET}/resumed/shard-000000.tar" not in shards_put  # the finished shard was not sent again
    s3_secrets_absent(str(e.value), caplog.text)


def test_503s_and_dropped_connections_on_puts_are_retried(bucket, local, proxy, tmp_path):
    proxy.reset(Faults(error_rate=0.2, drop_rate=0.15, seed=3))
    url = f"s3://{BUCKET}/faulty"
    write_shards(SyntheticReader(**READER), url, OPTS, staging=tmp_path / "stage")
    proxy.reset()
    assert _objects(bucket, "faulty") == _files(local)


def test_a_killed_cli_write_resumes_to_identical_objects(bucket, local, proxy, tmp_path):
    src = write_raw(tmp_path / "src", SyntheticReader(**READER))
    ref = tmp_path / "ref"
    assert main(["write", str(src), str(ref), "--shard-size", "20000", "--workers", "1"]) == 0
    url = f"s3://{BUCKET}/killed"
    proxy.reset(Faults(latency=0.15))  # slow enough to be killed between two shards
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")} | {
        k: os.environ[k] for k in ("AWS_ENDPOINT_URL", *CREDENTIALS)}
    cmd = [sys.executable, "-m", "episodepipes.sharding.cli", "write", str(src), url, "--shard-size", "20000",
           "--workers", "1", "--staging", str(tmp_path / "a")]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        done = [p for _, p, _ in proxy.puts() if "/shard-" in p]
        if len(done) >= 2:
            break
        time.sleep(0.02)
    assert proc.poll() is None, proc.stderr.read().decode()  # still running: it is killed mid-write
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    assert "index.json" not in _objects(bucket, "killed")
    proxy.reset()
    assert main(["write", str(src), url, "--shard-size", "20000", "--workers", "1",
                 "--staging", str(tmp_path / "a")]) == 0
    assert _objects(bucket, "killed") == _files(ref)


def test_a_finished_output_is_refused_and_overwrite_replaces_it_leaving_no_stale_object(bucket, proxy, tmp_path,
                                                                                        capsys):
    src = write_raw(tmp_path / "src", SyntheticReader(**READER))
    url, stage = f"s3://{BUCKET}/over", ["--staging", str(tmp_path / "s")]
    assert main(["write", str(src), url, "--shard-size", "10000", "--workers", "1", *stage]) == 0
    many = len([k for k in _objects(bucket, "over") if k.startswith("shard-")])
    capsys.readouterr()
    assert main(["write", str(src), url, "--shard-size", "10000", *stage]) == 2
    err = capsys.readouterr().err
    assert f"{url}/index.json exists: the output is finished; pass --overwrite" in err and len(err.splitlines()) == 1
    ref = tmp_path / "ref"
    assert main(["write", str(src), str(ref), "--shard-size", "40000", "--workers", "1"]) == 0
    assert main(["write", str(src), url, "--shard-size", "40000", "--workers", "1", "--overwrite", *stage]) == 0
    got = _objects(bucket, "over")
    assert got == _files(ref) and len([k for k in got if k.startswith("shard-")]) < many


def test_a_resume_with_other_options_and_a_foreign_prefix_are_refused_by_name(bucket, proxy, tmp_path, capsys):
    src = write_raw(tmp_path / "src", SyntheticReader(**READER))
    url = f"s3://{BUCKET}/half"
    proxy.reset(Faults(puts_ok=3))
    assert main(["write", str(src), url, "--shard-size", "20000", "--workers", "1",
                 "--staging", str(tmp_path / "s")]) == 2
    proxy.reset()
    capsys.readouterr()
    assert main(["write", str(src), url, "--shard-size", "30000", "--staging", str(tmp_path / "s")]) == 2
    assert f"{url} holds an unfinished write with other options (differ: shard_size, source)" in capsys.readouterr().err
    bucket.client().put_object(Bucket=BUCKET, Key="foreign/shard-000000.tar", Body=b"x")
    assert main(["write", str(src), f"s3://{BUCKET}/foreign", "--staging", str(tmp_path / "s")]) == 2
    assert "holds shards but no index.json or _progress.json" in capsys.readouterr().err
    assert main(["write", str(src), "https://example.invalid/x", "--staging", str(tmp_path / "s")]) == 2
    assert "writes to s3://bucket/prefix or gs://bucket/prefix only" in capsys.readouterr().err
    assert main(["write", str(src), str(tmp_path / "o"), "--staging", str(tmp_path / "s")]) == 2
    assert "--staging applies to a remote OUT" in capsys.readouterr().err


def test_jobs_write_to_the_remote_out_and_merge_there_into_the_single_job_objects(bucket, local, proxy, tmp_path,
                                                                                   capsys):
    src = write_raw(tmp_path / "src", SyntheticReader(**READER))
    url = f"s3://{BUCKET}/jobs"
    ref = tmp_path / "ref"
    assert main(["write", str(src), str(ref), "--shard-size", "20000", "--workers", "1"]) == 0
    base = ["write", str(src), url, "--shard-size", "20000", "--workers", "1", "--num-jobs", "2"]
    assert main([*base, "--job-index", "0", "--staging", str(tmp_path / "m0")]) == 0
    capsys.readouterr()
    assert main(["merge", url, "--staging", str(tmp_path / "m")]) == 2
    assert "jobs [1] of 2 are missing" in capsys.readouterr().err
    assert main([*base, "--job-index", "1", "--staging", str(tmp_path / "m1")]) == 0
    assert any(k.startswith("_jobs/job-0001/shard-") for k in _objects(bucket, "jobs"))
    assert main(["merge", url, "--staging", str(tmp_path / "m")]) == 0
    assert _objects(bucket, "jobs") == _files(ref)  # byte-identical to one job; the job outputs are gone
    assert main(["merge", url, "--staging", str(tmp_path / "m")]) == 2
    assert f"{url}/index.json exists: already merged" in capsys.readouterr().err
    assert main([*base, "--job-index", "0", "--staging", str(tmp_path / "m0")]) == 2
    assert f"{url}/index.json exists: the output is finished" in capsys.readouterr().err


def test_encoder_processes_forked_after_the_first_request_and_the_default_staging(bucket, local, proxy, tmp_path,
                                                                                  monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    url = f"s3://{BUCKET}/forked"
    write_shards(SyntheticReader(**READER), url, OPTS, workers=2)  # the pool forks after the listing and HEAD
    assert _objects(bucket, "forked") == _files(local)
    stage = tmp_path / "cache" / "episodepipes" / "staging"
    assert [p.parent for p in stage.rglob("*")] == [stage]  # its one staging folder, emptied
