"""The benchmark harness measures what it says: gated baselines, held workers, peer stages, page-cache bytes."""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import re
import resource
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from helpers import make_shards

from benchmarks.bench_gate import FlagGated
from benchmarks.bench_peers import ALWAYS, PEERS, _call, chosen, make_frames
from benchmarks.peers import common
from benchmarks.procs import held
from episodepipes.pipes import EpisodeIndex

pytestmark = pytest.mark.slow  # the benchmark harness: `pytest -m 'not slow'` leaves it out; `make test` runs it


def test_flag_gated_baseline_decodes_nothing_closed_and_everything_open(tmp_path):
    idx = EpisodeIndex.open(make_shards(tmp_path / "d", num_episodes=2, length=6, height=32, width=48))
    ctx = mp.get_context("fork")
    counter, render = ctx.Value("l", 0), ctx.Value("b", 0)
    eps = [e.id for e in idx.episodes]
    loader = torch.utils.data.DataLoader(FlagGated(idx, eps, counter, render), batch_size=4, num_workers=2,
                                         persistent_workers=True, multiprocessing_context=ctx)
    before = held()["processes"]  # a fork server an earlier process-method pass left (episodepipes' decode workers)
    assert list(loader) == [] and counter.value == 0
    assert held()["processes"] == before + 2  # persistent workers stay between passes
    render.value = 1  # the workers hold their own dataset copy; the shared flag reaches them
    frames = sorted(int(f) for b in loader for f in b["frame"])
    assert frames == sorted(list(range(6)) * 2) and counter.value == 12 * len(idx.episodes[0].cameras)
    del loader
    gc.collect()
    assert held()["processes"] == before


def test_resident_counts_only_the_pages_a_read_brought_in(tmp_path):
    f = tmp_path / "blob.bin"
    f.write_bytes(b"\1" * (8 << 20))
    common.evict(tmp_path)
    assert common.resident(tmp_path) == 0
    with open(f, "rb") as fh:
        fh.seek(4 << 20)
        fh.read(64 << 10)
    assert 64 << 10 <= common.resident(tmp_path) < 4 << 20  # the range read plus readahead, not the file


def test_peer_stages_write_the_same_jpeg_bytes_and_ours_resumes_exactly(tmp_path):
    data = tmp_path / "data"
    make_frames(data, episodes=3, length=40, size=64)
    log = tmp_path / "log"
    ours = _call("episodepipes", "convert", data, tmp_path / "ours", log=log)
    wds = _call("WebDataset", "convert", data, tmp_path / "wds", log=log)
    assert "error" not in ours and "error" not in wds, log.read_text()[-2000:]
    assert ours["jpeg_digest"] == wds["jpeg_digest"]
    saved = _call("episodepipes", "resume-save", data, tmp_path / "ours", "--stop-after", "1", log=log)
    assert saved.get("saved_after") == 1, saved
    resumed = _call("episodepipes", "resume-load", data, tmp_path / "ours", "--stop-after", "1", log=log)
    assert resumed["exact"] and resumed["expected"] == 96 - 32 == resumed["got"]
    train = _call("episodepipes", "train", data, tmp_path / "ours", log=log)
    assert train["frames"] == 96 and train["cpu_ms_per_frame"] > 0 and train["epoch_cpu_ms"] > 0
    assert train["first_batch_fresh_s"] > train["first_batch_s"]  # the fresh process's start-up and imports count
    bare = _call("bare simplejpeg, 2 threads", "convert", data, tmp_path / "bare", log=log)
    assert bare["jpeg_digest"] == ours["jpeg_digest"], log.read_text()[-2000:]
    for method in ("simplejpeg", "cv2"):
        t = _call("bare simplejpeg, 2 threads", "train", data, tmp_path / "bare", "--method", method, log=log)
        assert t["frames"] == t["unique_frames"] == 120, t  # every sample once: the bare decode keeps no last batch out
    p_ours = _call("episodepipes", "pinned", data, tmp_path / "ours", "--episode", "1", log=log)
    p_wds = _call("WebDataset", "pinned", data, tmp_path / "wds", "--episode", "1", log=log)
    assert p_ours["frames"] == p_wds["frames"] == 40
    assert p_ours["disk_bytes"] < p_wds["disk_bytes"]  # byte ranges of one episode vs streaming every shard


def test_tree_cpu_counts_worker_processes_live_and_reaped_and_what_they_reaped(tmp_path):
    burn = tmp_path / "burn.py"
    burn.write_text(textwrap.dedent("""
        import subprocess, sys, time
        def burn(s):
            t = time.process_time()
            while time.process_time() - t < s:
                pass
        burn(0.4)
        if sys.argv[1:] == ["parent"]:
            subprocess.run([sys.executable, __file__])  # a grandchild, reaped by the child
            burn(0.4)
            sys.stdin.read()  # stays alive until told
        """))
    def others() -> float:  # the tree's CPU less this process's own (which polls)
        me = resource.getrusage(resource.RUSAGE_SELF)
        return common.tree_cpu() - me.ru_utime - me.ru_stime

    before = others()
    child = subprocess.Popen([sys.executable, str(burn), "parent"], stdin=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while others() - before < 1.2 and time.monotonic() < deadline:
            assert child.poll() is None
            time.sleep(0.05)
        assert child.pid in common.descendants(os.getpid())
        live = others() - before  # the child is alive: read from /proc, its reaped grandchild in its cutime
    finally:
        child.communicate(b"")
    tick = 0.02  # /proc counts in 1/100 s ticks, this process's own time in microseconds: two ticks of slack
    assert live >= 1.2 - tick and others() - before >= 1.2 - tick  # reaped by us now: through RUSAGE_CHILDREN


def test_epbench_peers_chooses_rows_and_refuses_unknown_names():
    assert chosen("") == list(PEERS)
    picked = chosen("grain, dali")
    assert picked == [p for p in PEERS if p in ALWAYS or PEERS[p].key in ("grain", "dali")]
    assert "Grain, processes" not in picked and "DALI, CPU pipeline" in picked
    with pytest.raises(SystemExit, match="unknown grian"):
        chosen("grian")


def test_bench_records_the_commit_it_measured():
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    import bench

    assert re.fullmatch(r"[0-9a-f]{7,40}(-dirty)?", bench._commit())


def _section(rows_ours):
    return {"intro": "x", "rows": [{"metric": "m", "ours": rows_ours, "baseline": 1.0, "ceiling": None,
                                    "unit": "frames/s", "note": ""}]}


def test_a_partial_benchmark_run_keeps_the_other_sections_each_with_its_own_commit(tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    import bench

    bench.write_docs({"gate": _section(5.0), "train": _section(7.0)}, tmp_path, commit="aaaa", command="one")
    bench.write_docs({"train": _section(9.0)}, tmp_path, commit="bbbb", command="two", note="loaded")
    md = (tmp_path / "BENCHMARKS.md").read_text()
    gate, train = md.split("## train")
    assert "## gate" in gate and "Commit `aaaa`; command `one`" in gate and "bbbb" not in gate
    assert "Commit `bbbb`; command `two`. **loaded**" in train and "aaaa" not in train
    assert "| m | 9.00 |" in train and "| m | 7.00 |" not in md  # the re-run section's figure replaced the old
    assert "| m | 5.00 |" in gate
    bench.write_docs({"gate": _section(6.0)}, tmp_path, commit="cccc", command="three", quick=True)
    assert "aaaa" not in (tmp_path / "BENCHMARKS.md").read_text()  # a quick run keeps nothing of the figures
