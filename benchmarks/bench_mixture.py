"""Mixtures: train_pipe over two sources against one source on the same frames, resume cost, and the schedule.

The overhead row splits one index's episodes in two `Source`s (weights proportional to their frames) and
times whole epochs of both pipes, paired and alternating; the resume table times ``load_state_dict`` to
the first batch at several steps of the epoch (flat: the cursor is O(1), nothing is replayed).
The schedule table compares the O(1)-memory epoch order and the mixture schedule with numpy's permutation.
Each case runs in a fresh interpreter, so its peak memory growth (``ru_maxrss`` after minus before) is its
own. ``numpy`` materialises ``rng.permutation(n)`` (8 bytes per sample, per rank); ``feistel`` walks the
same ``n`` positions through `IndexShuffle` in blocks of 2**20, so its memory is one block whatever ``n``.
Run: ``python scripts/bench.py mixture [--quick]`` (or ``python -m benchmarks.bench_mixture [--quick]``).
"""

from __future__ import annotations

import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.bench_train import BATCH, make_data
from episodepipes.index import EpisodeIndex
from episodepipes.pipes import Source, train_pipe
from episodepipes.pipes.order.mixture import Mixture
from episodepipes.pipes.order.permute import IndexShuffle

BLOCK = 1 << 20


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _case(name: str, n: int) -> dict:
    before = _rss_mb()
    t0 = time.perf_counter()
    if name == "numpy":
        perm = np.random.default_rng(np.random.SeedSequence(0, spawn_key=(0,))).permutation(n)
        check = int(perm[n // 2])
    elif name == "feistel":
        p = IndexShuffle.of(n, seed=0, epoch=0)
        check = 0
        for a in range(0, n, BLOCK):
            check ^= int(p(np.arange(a, min(a + BLOCK, n)))[-1])
    elif name == "feistel_batch256":
        p, pos = IndexShuffle.of(n, seed=0, epoch=0), np.arange(256)
        for b in range(2000):
            check = int(p(pos + b * 256)[0])
        n = 2000 * 256
    elif name == "feistel_scalar":
        p = IndexShuffle.of(n, seed=0, epoch=0)
        for i in range(20_000):
            check = p(i)
        n = 20_000
    elif name.startswith("mixture"):  # mixture<k>: k sources of unequal weights, per-batch samples()
        k = int(name[len("mixture"):])
        m = Mixture.of({f"s{i}": i + 1 for i in range(k)}, {f"s{i}": 10_000 * (i + 1) for i in range(k)})
        pos = np.arange(256)
        for b in range(200):
            check = int(m.samples(pos + b * 256, seed=0, epoch=0)[1][0])
        n = 200 * 256
    else:
        raise ValueError(f"unknown case {name!r}")
    dt = time.perf_counter() - t0
    return {"case": name, "samples": n, "seconds": dt, "ns_per_sample": dt / n * 1e9,
            "peak_growth_mb": _rss_mb() - before, "check": check}


def _in_child(name: str, n: int) -> dict:
    out = subprocess.run([sys.executable, "-m", "benchmarks.bench_mixture", "--case", name, str(n)],
                         check=True, capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent)
    return json.loads(out.stdout)


def _schedule(quick: bool) -> dict:
    """Every order/schedule case at ``n`` = 3e6 (quick) or 3e7 samples, each in a fresh interpreter."""
    n = 3_000_000 if quick else 30_000_000
    rows = [_in_child(c, n) for c in ("numpy", "feistel", "feistel_batch256", "feistel_scalar",
                                      "mixture2", "mixture4", "mixture8")]
    return {"title": f"epoch order and mixture schedule, n={n:,} (fresh process per case)",
            "columns": ["case", "samples", "ns/sample", "peak growth MB"],
            "rows": [[r["case"], f"{r['samples']:,}", f"{r['ns_per_sample']:,.0f}", f"{r['peak_growth_mb']:.1f}"]
                     for r in rows]}


def _pass(pipe: Any) -> tuple[int, float]:
    """(frames, seconds) of one pass of ``pipe`` (its next epoch)."""
    t0, n = time.perf_counter(), 0
    for b in pipe:
        n += len(b["episode"])
    return n, time.perf_counter() - t0


def _spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.1f} [{min(xs):.1f}-{max(xs):.1f}]"


def _pipes(idx: EpisodeIndex, **kw: Any) -> tuple[Any, Any]:
    """A train_pipe over ``idx``, and a mixture of the same frames split in two sources by episode (weights
    proportional to their frames, so the mixture's epoch is the same frames in another order)."""
    eps = idx.split("train")
    half = [e.id for e in eps[: len(eps) // 2]], [e.id for e in eps[len(eps) // 2:]]
    frames = [sum(idx.episode(i).length for i in h) for h in half]
    single = train_pipe(idx, **kw)
    mix = train_pipe({"a": Source(idx, frames[0], episodes=half[0]), "b": Source(idx, frames[1], episodes=half[1])},
                     stop="first_exhausted", **kw)
    return single, mix


def _overhead(idx: EpisodeIndex, reps: int) -> tuple[dict, list[float]]:
    kw = dict(batch_size=BATCH, seed=0, rank=0, world_size=1, num_workers=2)
    single, mix = _pipes(idx, **kw)
    _pass(single), _pass(mix)  # warm the page cache and the workers' first start
    fps: dict[str, list[float]] = {"single": [], "mix": []}
    ratios = []
    for r in range(reps):  # paired: both in each repeat, the order alternating
        got = {}
        for name, pipe in ((("single", single), ("mix", mix)) if r % 2 == 0 else (("mix", mix), ("single", single))):
            n, dt = _pass(pipe)
            got[name] = n / dt
            fps[name].append(n / dt)
        ratios.append(got["mix"] / got["single"])
    row = {"metric": "mixture of 2 sources vs one source, same frames (threads)",
           "ours": statistics.median(fps["mix"]), "baseline": statistics.median(fps["single"]), "ceiling": None,
           "unit": "frames/s",
           "note": f"{len(mix) * BATCH} vs {len(single) * BATCH} frames per epoch, 2 threads, batch {BATCH}; paired "
                   f"ratio mix/single over {reps} repeats: median {statistics.median(ratios):.3f}, range "
                   f"{min(ratios):.3f}-{max(ratios):.3f}"}
    return row, ratios


def _resume(idx: EpisodeIndex, reps: int) -> dict:
    """Seconds from ``load_state_dict`` to the first batch, at several positions in the epoch."""
    kw = dict(batch_size=BATCH, seed=0, rank=0, world_size=1, num_workers=2)
    rows = []
    for name, pipe in zip(("one source", "mixture"), _pipes(idx, **kw)):
        steps = len(pipe)
        at = sorted({0, steps // 4, steps // 2, 3 * steps // 4, steps - 1})
        states, it = {}, iter(pipe)
        for k in range(steps):
            if k in at:
                states[k] = pipe.state_dict()
            next(it)
        for k in at:
            times = []
            for _ in range(reps):
                fresh = _pipes(idx, **kw)[name == "mixture"]
                t0 = time.perf_counter()
                fresh.load_state_dict(states[k])
                next(iter(fresh))
                times.append((time.perf_counter() - t0) * 1e3)
                fresh.shutdown()
            rows.append([name, f"step {k} of {steps}", _spread(times)])
    return {"title": "resume cost: load_state_dict to the first batch (ms, median [range])",
            "columns": ["pipe", "position", "ms"], "rows": rows}


def run(workdir: Path, quick: bool) -> dict:
    """Mixture overhead and resume cost on 224x224 two-camera frames, and the schedule's cost per sample."""
    eps, length = (8, 60) if quick else (24, 150)
    idx = make_data(workdir / "mix-shards", episodes=eps, length=length)
    reps = 3 if quick else 7
    row, _ = _overhead(idx, reps)
    resume = _resume(idx, 3 if quick else 5)
    return {"section": "mixture", "intro": __doc__.split("\n\n", 1)[1].strip(), "rows": [row],
            "tables": [resume, _schedule(quick)]}


if __name__ == "__main__":
    if sys.argv[1:2] == ["--case"]:
        print(json.dumps(_case(sys.argv[2], int(sys.argv[3]))))
    else:
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            print(json.dumps(run(Path(tmp), "--quick" in sys.argv), indent=1))
