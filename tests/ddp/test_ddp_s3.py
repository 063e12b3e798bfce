"""The 2-process gloo fit of tests/ddp/app.py on an ``s3://`` root (moto behind a counting proxy) gives the local run.

Only the standard environment (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ...) reaches the ranks. Each rank opens
the index and reads its frames through the remote byte source in its main process, then forks its decode
workers (the video pipe uses ``method="process"``), which never touch it.
"""

from __future__ import annotations

import pytest
from ddp.test_ddp_fit import EPOCHS, PINNED, _deltas, _is_render, launch
from s3server import CREDENTIALS, FaultProxy, MotoS3, s3_env

from episodepipes.lightning_glue.launch import check_ranks
from episodepipes.pipes import EpisodeIndex

pytestmark = pytest.mark.slow  # real multi-process DDP: `pytest -m 'not slow'` leaves it out; `make test` runs it


@pytest.fixture(scope="module")
def remote_run(ddp_shards, ddp_local_run, tmp_path_factory):
    shards, local = ddp_shards, ddp_local_run  # test_ddp_fit's dataset and its local run (tests/ddp/conftest.py)
    moto = MotoS3()
    proxy = FaultProxy(moto.endpoint)
    try:
        moto.upload_dir(shards, "ddp", "shards")
        proxy.reset()
        remote = launch("s3://ddp/shards", tmp_path_factory.mktemp("ddp-remote"), epochs=EPOCHS,
                        env_extra=s3_env(proxy.endpoint))
        yield {"local": local, "remote": remote, "shards": shards, "gets": proxy.gets(), "bytes": proxy.body_bytes}
    finally:
        proxy.close()
        moto.close()


def test_both_ranks_finish_and_yield_what_the_local_run_yields(remote_run):
    local, remote = remote_run["local"], remote_run["remote"]
    check_ranks(remote["exits"])
    assert sorted(remote["ranks"]) == [0, 1] and remote["ranks"][0]["world_size"] == 2
    for r in (0, 1):  # the same passes, the same synced metric, the same counters of frames read and decoded
        lr, rr = local["ranks"][r], remote["ranks"][r]
        assert rr["fit"] == lr["fit"] and rr["validate"] == lr["validate"]
        assert [p["step"] for p in rr["passes"]] == [p["step"] for p in lr["passes"]]
        for key in ("video", "metric"):
            for a, b in zip(_deltas(rr["passes"], key), _deltas(lr["passes"], key), strict=True):
                assert a == b
    assert {p.split("/")[-1] for p in remote["ranks"][0]["written"]} == \
        {p.split("/")[-1] for p in local["ranks"][0]["written"]}
    assert remote["ranks"][1]["written"] == []


def test_the_ranks_fetch_ranges_of_their_frames_only(remote_run):
    remote, shards = remote_run["remote"], remote_run["shards"]
    index = EpisodeIndex.open(shards)
    shard_names = {s.name for s in index.shards}
    gets = [g for g in remote_run["gets"] if g[1].split("/")[-1] in shard_names]
    assert gets and all(rng is not None and rng.startswith("bytes=") for _, _, rng in gets)  # never a whole shard
    read = 0
    for r in (0, 1):  # the pipes' own count of the bytes they read (fit, then validate()'s fresh pipes)
        for key in ("video", "metric"):
            read += sum(d["bytes_read"] for d in _deltas(remote["ranks"][r]["passes"], key))
    assert 0 < read < remote_run["bytes"]  # coalescing reads the small gaps between a metric pass's frames too
    renders = sum(_is_render(remote["ranks"][0]["passes"]))
    assert renders == 3 and all(d["bytes_read"] == 0 for d in _deltas(remote["ranks"][1]["passes"], "video"))
    assert len(PINNED) == 2


def test_no_credential_reaches_a_rank_log(remote_run):
    for p in (remote_run["remote"]["out"] / "logs").iterdir():
        text = p.read_text(errors="replace")
        assert CREDENTIALS["AWS_SECRET_ACCESS_KEY"] not in text and CREDENTIALS["AWS_ACCESS_KEY_ID"] not in text
