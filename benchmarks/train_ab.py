"""One lever at a time: `train_pipe` from several source trees (a before and an after), each against the bare
simplejpeg decode run just before it, in fresh processes whose order alternates round by round.

On a shared 2-core box the same tree's ratio moves by a tenth from run to run; only pairs measured side by side
say whether a change helps. Each child process imports one tree (``PYTHONPATH``), warms a pipe for one epoch,
then runs ``reps`` rounds of (the ceiling pass, one epoch); the parent prints, per tree, the median and range of
wall and per-CPU-second ratios to the ceiling and the CPU ms per frame (`benchmarks.bench_train`'s measures).

    git -C /work/main archive <base> | tar -x -C /tmp/before
    python -m benchmarks.train_ab /tmp/before,$PWD --size 224 --method thread --rounds 4 --reps 2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

SIZES = {"224": ((224, 224), 24), "480": ((480, 640), 12)}  # footage size, episodes (150 steps each)


def child(data: str, method: str, reps: int) -> list[dict]:
    """In a fresh process of one tree: ``reps`` rounds of (ceiling pass, one epoch) after a warm epoch."""
    from benchmarks.bench_train import BATCH, _ceiling_pass, _cpu, _jpegs, _timed_pass
    from episodepipes.index import EpisodeIndex
    from episodepipes.pipes.train import train_pipe

    idx = EpisodeIndex.open(data)
    jpegs = _jpegs(idx)
    pipe = train_pipe(idx, batch_size=BATCH, seed=0, rank=0, world_size=1, num_workers=2, method=method)
    for _ in pipe:  # the first epoch makes the batch buffers every later one reuses
        pass
    out = []
    for _ in range(reps):
        t0, c0 = time.perf_counter(), _cpu()
        n = _ceiling_pass(jpegs)
        fps, cpu_fps = n / (time.perf_counter() - t0), n / max(_cpu() - c0, 1e-9)
        r = _timed_pass(pipe)
        out.append({"wall": r["fps"] / fps, "cpu": r["cpu_fps"] / cpu_fps, "ms": 1000 / r["cpu_fps"],
                    "ceiling_ms": 1000 / cpu_fps})
    pipe.shutdown()
    return out


def _span(values: list[float]) -> str:
    v = sorted(values)
    return f"{v[len(v) // 2]:.3f} ({v[0]:.3f}-{v[-1]:.3f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trees", nargs="?", help="comma-separated source trees (each holds episodepipes/ and benchmarks/)")
    ap.add_argument("--size", choices=sorted(SIZES), default="224")
    ap.add_argument("--method", choices=["thread", "process"], default="thread")
    ap.add_argument("--rounds", type=int, default=4, help="rounds; each runs every tree once, order alternating")
    ap.add_argument("--reps", type=int, default=2, help="(ceiling, epoch) pairs per child process")
    ap.add_argument("--data", type=Path, default=Path("/tmp/episodepipes-train-ab"), help="footage shards (kept)")
    ap.add_argument("--child", nargs=3, metavar=("DATA", "METHOD", "REPS"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.child[0], a.child[1], int(a.child[2]))))
        return
    if not a.trees:
        ap.error("give the trees to compare, comma-separated")
    size, episodes = SIZES[a.size]
    data = a.data / a.size
    if not (data / "index.json").exists():
        from benchmarks.footage import shard_footage

        shard_footage(data, episodes=episodes, length=150, size=size)
    trees = [str(Path(t).resolve()) for t in a.trees.split(",")]
    got: dict[str, list[dict]] = {t: [] for t in trees}
    for i in range(a.rounds):
        for t in trees if i % 2 == 0 else trees[::-1]:
            # this file, run with the tree first on the path: its `benchmarks` and `episodepipes` are imported
            run = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", str(data), a.method,
                                  str(a.reps)], cwd=t, env={**os.environ, "PYTHONPATH": t}, capture_output=True,
                                 text=True)
            if run.returncode:
                raise SystemExit(f"tree {t}: the child failed:\n{run.stderr[-3000:]}")
            got[t] += json.loads(run.stdout.strip().splitlines()[-1])
    for t, rs in got.items():
        print(f"{t}: {len(rs)} pairs; x the ceiling {_span([r['wall'] for r in rs])}, per CPU second "
              f"{_span([r['cpu'] for r in rs])}; CPU ms/frame {_span([r['ms'] for r in rs])} (ceiling "
              f"{_span([r['ceiling_ms'] for r in rs])})")


if __name__ == "__main__":
    main()
