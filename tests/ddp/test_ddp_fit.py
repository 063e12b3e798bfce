"""A real 2-process gloo fit (then ``trainer.validate()``) of tests/ddp/app.py, checked from per-rank counters.

Each rank is its own subprocess, started, waited for and checked by `run_ranks`: a rank that fails after
rank 0 finished is reported, and a desync fails within the strategy timeout (60 s) and never hangs the
suite (past ``DEADLINE`` the ranks are stopped with SIGTERM, then SIGKILL, since Lightning handles SIGTERM).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import cv2
import pytest
import torch
from ddp.app import TinyModel, target
from helpers import run_script_ranks

from episodepipes.lightning_glue.launch import RanksFailed, check_ranks
from episodepipes.pipes import EpisodeIndex, metric_pipe

pytestmark = pytest.mark.slow  # real multi-process DDP: `pytest -m 'not slow'` leaves it out; `make test` runs it

APP = Path(__file__).with_name("app.py")
PINNED = ["ep0000", "ep0003"]  # train-split episodes: the metric pipe (val split) never reads them
EPOCHS, EVERY, FPS, LENGTH = 4, 2, 7.5, 12
DEADLINE = 150  # seconds for the whole run; the strategy's timeout is 60


def launch(root: Path, out: Path, *, epochs: int = EPOCHS, env_extra: dict | None = None) -> dict:
    """Run app.py's two ranks with `run_ranks`: every rank is waited for and its exit status kept."""
    t0 = time.perf_counter()
    exits = run_script_ranks(APP, str(root), str(out), "--epochs", str(epochs), "--every", str(EVERY), "--timeout",
                             "60", nprocs=2, out=out, timeout=DEADLINE, env_extra=env_extra)
    seconds = time.perf_counter() - t0
    ranks = {r: json.loads(p.read_text()) for r in (0, 1) if (p := out / f"rank{r}.json").exists()}
    return {"exits": exits, "root": root, "out": out, "ranks": ranks, "seconds": seconds}


@pytest.fixture
def shards(ddp_shards):
    return ddp_shards  # tests/ddp/conftest.py


@pytest.fixture
def run(ddp_local_run):
    return ddp_local_run  # tests/ddp/conftest.py: one fit, which test_ddp_s3 compares its s3:// run with


TIMES = ("worker_cpu_us",)  # counters of time, not of work: they differ between runs of the same work


def _deltas(passes: list[dict], key: str) -> list[dict]:
    """Per-pass counter increments; validate() builds fresh pipes, so counters restart with it."""
    out, prev, fn = [], {}, None
    for p in passes:
        prev = prev if p["fn"] == fn else {}
        fn = p["fn"]
        out.append({k: v - prev.get(k, 0) for k, v in p[key].items() if k not in TIMES})
        prev = p[key]
    return out


def _is_render(passes: list[dict]) -> list[bool]:
    out, fit = [], 0
    for p in passes:
        if p["fn"] == "fit" and not p["sanity"]:
            fit += 1
        out.append(p["fn"] == "validate" or (p["fn"] == "fit" and not p["sanity"] and fit % EVERY == 0))
    return out


def test_both_ranks_finish(run):
    check_ranks(run["exits"])  # every rank waited for; a failure names the rank and its log's tail
    assert [e.returncode for e in run["exits"]] == [0, 0]
    assert sorted(run["ranks"]) == [0, 1]
    assert run["ranks"][0]["world_size"] == 2 and run["ranks"][0]["pid"] != run["ranks"][1]["pid"]
    for r in (0, 1):  # sanity check + one pass per epoch + validate()
        kinds = [(p["fn"], p["sanity"]) for p in run["ranks"][r]["passes"]]
        assert kinds == [("fit", True)] + [("fit", False)] * EPOCHS + [("validate", False)]


def test_rank0_decodes_pinned_frames_only_on_render_passes(run):
    passes = run["ranks"][0]["passes"]
    render = _is_render(passes)
    assert render == [False, False, True, False, True, True]
    frames = LENGTH * len(PINNED) * 2  # two cameras
    for d, r in zip(_deltas(passes, "video"), render):
        assert d["open_passes"] == int(r) and d["closed_passes"] == int(not r)
        assert d["frames_decoded"] == (frames if r else 0)
        assert (d["bytes_read"] > 0) == r and d["workers_started"] == (1 if r else 0)


def test_rank1_never_touches_the_pinned_episodes(run):
    rank1 = run["ranks"][1]
    for d in _deltas(rank1["passes"], "video"):  # the fit's pipes, then validate()'s
        assert d["bytes_read"] == 0 and d["frames_read"] == 0 and d["frames_decoded"] == 0
        assert d["workers_started"] == 0 and d["open_passes"] == 0 and d["closed_passes"] == 1
    assert rank1["written"] == []
    # its metric pipe worked every pass (val episodes only, disjoint from the pinned train episodes)
    assert all(d["batches"] == 2 for d in _deltas(rank1["passes"], "metric"))
    index = EpisodeIndex.open(run["root"])
    assert {e.split for e in (index.episode(x) for x in PINNED)} == {"train"}
    assert len(index.split("val")) % 2 == 1  # odd: the split is padded


def test_synced_metric_is_identical_on_both_ranks_and_matches_one_process(run):
    r0, r1 = run["ranks"][0], run["ranks"][1]
    assert r0["validate"] == r1["validate"] and r0["fit"] == r1["fit"]
    model = TinyModel()
    model.load_state_dict(torch.load(run["out"] / "model.pt"))
    total, count = 0.0, 0
    with torch.no_grad():
        for b in metric_pipe(run["root"], frames_per_episode=5, batch_size=4, rank=0, world_size=1):
            assert bool(b["valid"].all())
            total += float((model(b["front"]) - target(b)).abs().sum(1).sum())
            count += len(b["frame"])
    assert count == 15 == r0["validate"]["count"]  # every chosen frame once; the padded one not at all
    assert r0["validate"]["err_sum"] == pytest.approx(total, rel=1e-5)


def test_one_mp4_per_pinned_episode_per_render_pass_from_rank0(run):
    passes = run["ranks"][0]["passes"]
    expected = set()
    for p, r in zip(passes, _is_render(passes)):
        if r:
            suffix = "_validate" if p["fn"] == "validate" else ""
            expected |= {f"{e}_step{p['step']:08d}{suffix}.mp4" for e in PINNED}
    videos = run["out"] / "videos" / "pinned"
    on_disk = {p.name for p in videos.iterdir()}
    assert on_disk == expected and len(expected) == len(PINNED) * 3  # two fit render passes + validate
    assert sorted(Path(p).name for p in run["ranks"][0]["written"]) == sorted(expected)
    for name in expected:
        cap = cv2.VideoCapture(str(videos / name))
        n = 0
        while cap.read()[0]:
            n += 1
        assert n == LENGTH and cap.get(cv2.CAP_PROP_FPS) == pytest.approx(FPS)
        cap.release()


def test_a_rank_that_fails_after_rank0_finished_is_reported(shards, tmp_path):
    res = launch(shards, tmp_path, epochs=1, env_extra={"EPISODEPIPES_TEST_LATE_EXIT": "1:3"})
    r0, r1 = res["exits"]
    assert r0.ok and sorted(res["ranks"]) == [0, 1]  # rank 0 (and rank 1's work) finished normally
    assert r1.returncode == 3 and not r1.ok and not r1.killed_by_us
    with pytest.raises(RanksFailed, match=r"1 of 2 ranks failed: rank 1 exited with status 3") as e:
        check_ranks(res["exits"])
    assert str(tmp_path / "logs" / "rank1.log") in str(e.value)
    assert "rank 0" not in str(e.value).split("\n")[0]


def test_run_time(run):
    print(f"DDP fit + validate subprocess: {run['seconds']:.1f} s")
    assert run["seconds"] < 120
