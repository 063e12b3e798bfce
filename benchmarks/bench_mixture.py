"""The O(1)-memory epoch order and the mixture schedule: cost per sample, against numpy's permutation.

Each case runs in a fresh interpreter, so its peak memory growth (``ru_maxrss`` after minus before) is its
own. ``numpy`` materialises ``rng.permutation(n)`` (8 bytes per sample, per rank); ``feistel`` walks the
same ``n`` positions through `IndexShuffle` in blocks of 2**20, so its memory is one block whatever ``n``.
Run: ``python -m benchmarks.bench_mixture [--quick]``.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from episodepipes.pipes.mixture import Mixture
from episodepipes.pipes.permute import IndexShuffle

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


def run(workdir: Path, quick: bool) -> dict:
    """Every case at ``n`` = 3e6 (quick) or 3e7 samples; ``workdir`` is unused (nothing is written)."""
    n = 3_000_000 if quick else 30_000_000
    rows = [_in_child(c, n) for c in ("numpy", "feistel", "feistel_batch256", "feistel_scalar",
                                      "mixture2", "mixture4", "mixture8")]
    return {"n": n, "rows": rows}


if __name__ == "__main__":
    if sys.argv[1:2] == ["--case"]:
        print(json.dumps(_case(sys.argv[2], int(sys.argv[3]))))
    else:
        for r in run(Path("."), "--quick" in sys.argv)["rows"]:
            print(f"{r['case']:18s} {r['samples']:>11,d} samples  {r['seconds']:7.2f} s  "
                  f"{r['ns_per_sample']:8.0f} ns/sample  peak +{r['peak_growth_mb']:7.1f} MB")
