"""The ``scale`` section: what an index costs against its number of episodes, 10**3 to 10**6 (10**5 to 10**8 frames).

Each index is made by `benchmarks.scale_index` (100 frames of 50 KB per episode, 512 MB sparse shards, as the writer
lays them out) and every figure is measured in a fresh process (`ROWS`: one function per figure, each given the
index folder, returning a dict of numbers; add a row by appending a function):

- ``open``: `EpisodeIndex.open` wall time; the process's growth in ``Private_Clean + Private_Dirty`` and
  ``Anonymous`` (``/proc/self/smaps_rollup``) across it, alone and beside a process holding the same index open
  (``shared_private``: what each further rank or worker of a node pays, the columns' pages being shared);
- ``lookup``: the cost of the first frame lookup of a segment (`EpisodeIndex.frame_ranges` of a new episode's
  frames, 200 of them at random), the bytes it allocates (tracemalloc peak) and the pages it read from disk (major
  faults: a lookup reads a page of ``offset`` and of ``size``, from disk where the page cache does not hold them);
- ``where``: building ``video_pipe(where=...)`` that keeps one robot's val episodes;
- ``train_build``/``metric_build``: building ``train_pipe(shuffle="block")`` and ``metric_pipe`` for rank 0 of 8
  (skipped past ``--pipes-max`` episodes; a build over `TIMEOUT` seconds is reported as such);
- ``train_first``/``metric_first``: building ``train_pipe(shuffle="full")``, then the first batch of it and of
  ``metric_pipe`` with the per-frame columns evicted from the page cache first (a node that has not read them:
  ``posix_fadvise(DONTNEED)`` on those files), and the first batch of the same train pipe built again
  (``train_next_s``: the same frames, cached and checked).

    python scripts/bench.py scale --out /tmp/scale        # 10^3 .. 10^6 episodes
    python benchmarks/bench_scale.py --max 100000 [--listed --code /path/to/other/checkout]

``--listed`` writes the indexes as older writers did (ids in ``index.json``) and ``--code`` runs the children with
another checkout's ``episodepipes``: how the figures on main were measured.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if "--child" not in sys.argv:  # a child imports episodepipes from the PYTHONPATH `measure` gives it (--code)
    sys.path.insert(0, str(ROOT))

SIZES = [1_000, 10_000, 100_000, 1_000_000]
LENGTH = 100
TIMEOUT = 300.0
GOALS = {"open_s": 0.3, "open_private_mb": 50, "where_s": 1.0, "train_build_s": 2.0, "metric_build_s": 2.0,
         "train_full_build_s": 2.0, "train_first_s": 1.0}


def _memory() -> dict[str, float]:
    out = {}
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines()[1:]:
        key, value = line.split(":")
        out[key] = int(value.split()[0]) / 1024  # kB -> MB
    return {"private": out["Private_Clean"] + out["Private_Dirty"], "anon": out["Anonymous"]}


def row_open(path: str) -> dict:
    """Open alone, then beside a holder process that has the same index open."""
    import gc

    from episodepipes.index import EpisodeIndex

    gc.collect()
    before = _memory()
    t0 = time.perf_counter()
    index = EpisodeIndex.open(path)
    seconds = time.perf_counter() - t0
    after = _memory()
    out = {"open_s": seconds, "open_private_mb": after["private"] - before["private"],
           "open_anon_mb": after["anon"] - before["anon"], "episodes": len(index.episodes)}
    return out


def row_open_shared(path: str) -> dict:
    """`row_open` in a process started while another holds the index open: a further rank's or worker's cost."""
    holder = subprocess.Popen([sys.executable, "-c", "import sys; from episodepipes.index import EpisodeIndex; "
                               f"ix = EpisodeIndex.open({path!r}); print('ok', flush=True); sys.stdin.read()"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=os.environ.copy())
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ok"
        got = row_open(path)
    finally:
        holder.kill()
        holder.wait()
    return {"shared_private_mb": got["open_private_mb"], "shared_open_s": got["open_s"]}


def row_lookup(path: str) -> dict:
    """The first lookup of 200 episodes' frames, each a segment not touched before: seconds and bytes each."""
    import tracemalloc

    import numpy as np

    from episodepipes.index import EpisodeIndex

    index = EpisodeIndex.open(path)
    n = len(index.episodes)
    picks = np.random.default_rng(0).choice(n, size=min(200, n), replace=False)
    rows = [np.arange(k * LENGTH, (k + 1) * LENGTH) for k in picks.tolist()]
    index.frame_ranges(rows[0])  # imports and first-use samples out of the timing
    import resource

    faults = resource.getrusage(resource.RUSAGE_SELF).ru_majflt
    t0 = time.perf_counter()
    for r in rows[1:]:
        index.frame_ranges(r)
    per = (time.perf_counter() - t0) / max(len(rows) - 1, 1)
    # pages read from disk per lookup: where the page cache does not hold the columns, what the time is made of
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_majflt - faults) / max(len(rows) - 1, 1)
    tracemalloc.start()
    peaks = []
    for k in np.random.default_rng(1).choice(n, size=min(20, n), replace=False).tolist():
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        index.frame_ranges(np.arange(k * LENGTH, (k + 1) * LENGTH))
        peaks.append(tracemalloc.get_traced_memory()[1] - base)
    tracemalloc.stop()
    return {"lookup_ms": per * 1e3, "lookup_peak_kb": max(peaks) / 1024, "lookup_disk_reads": faults}


def row_where(path: str) -> dict:
    from episodepipes.index import EpisodeIndex
    from episodepipes.pipes import video_pipe

    index = EpisodeIndex.open(path)
    t0 = time.perf_counter()
    pipe = video_pipe(index, where=lambda a: a.get("robot") == "aloha" and a["split"] == "val", batch_size=8,
                      max_batches=2)
    return {"where_s": time.perf_counter() - t0, "where_len": len(pipe)}


def row_train_build(path: str) -> dict:
    from episodepipes.index import EpisodeIndex
    from episodepipes.pipes import train_pipe

    index = EpisodeIndex.open(path)
    t0 = time.perf_counter()
    pipe = train_pipe(index, batch_size=32, seed=0, rank=0, world_size=8, shuffle="block")
    return {"train_build_s": time.perf_counter() - t0, "train_len": len(pipe)}


def row_metric_build(path: str) -> dict:
    from episodepipes.index import EpisodeIndex
    from episodepipes.pipes import metric_pipe

    index = EpisodeIndex.open(path)
    t0 = time.perf_counter()
    pipe = metric_pipe(index, split="train", frames_per_episode=4, batch_size=32, rank=0, world_size=8)
    return {"metric_build_s": time.perf_counter() - t0, "metric_len": len(pipe)}


def _drop_cached(path: str) -> None:
    """Evict the per-frame columns of the index at ``path`` from the page cache (those pages only, and only where
    no process maps them in): a first batch on a node that has not read them yet."""
    for name in ("offset", "size", "crc32"):
        file = Path(path) / f"index.{name}.npy"
        if file.exists():
            fd = os.open(file, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _first_batch(pipe: object, path: str) -> float:
    """Seconds to the first batch of ``pipe`` with the per-frame columns out of the page cache."""
    import logging

    logging.disable(logging.WARNING)  # the sparse shards' frames are zeros: every one is counted corrupt
    _drop_cached(path)
    t0 = time.perf_counter()
    next(iter(pipe))  # type: ignore[call-overload]
    return time.perf_counter() - t0


def row_train_first(path: str) -> dict:
    """``train_pipe(shuffle="full")`` for rank 0 of 8: its build, its first batch on a cold page cache, and the
    first batch of the same pipe built again (the same frames: their pages cached, their segments checked)."""
    from episodepipes.index import EpisodeIndex
    from episodepipes.pipes import train_pipe

    index = EpisodeIndex.open(path)
    t0 = time.perf_counter()
    pipe = train_pipe(index, batch_size=32, seed=0, rank=0, world_size=8, shuffle="full")
    build = time.perf_counter() - t0
    cold = _first_batch(pipe, path)
    again = train_pipe(index, batch_size=32, seed=0, rank=0, world_size=8, shuffle="full")
    t0 = time.perf_counter()
    next(iter(again))
    return {"train_full_build_s": build, "train_first_s": cold, "train_next_s": time.perf_counter() - t0}


def row_metric_first(path: str) -> dict:
    """``metric_pipe`` (every episode, 4 frames each) for rank 0 of 8: its first batch on a cold page cache."""
    from episodepipes.index import EpisodeIndex
    from episodepipes.pipes import metric_pipe

    index = EpisodeIndex.open(path)
    pipe = metric_pipe(index, split="train", frames_per_episode=4, batch_size=32, rank=0, world_size=8)
    return {"metric_first_s": _first_batch(pipe, path)}


# (name, function, whether it builds pipes): a row is skipped past --pipes-max episodes when it does
ROWS: list[tuple[str, Callable[[str], dict], bool]] = [
    ("open", row_open, False), ("open_shared", row_open_shared, False), ("lookup", row_lookup, False),
    ("where", row_where, False), ("train_build", row_train_build, True), ("metric_build", row_metric_build, True),
    ("train_first", row_train_first, True), ("metric_first", row_metric_first, True),
]


def measure(name: str, path: Path, code: Path | None = None) -> dict:
    """Run row ``name`` on ``path`` in a fresh process (its ``episodepipes`` from ``code``, or this checkout)."""
    env = dict(os.environ, PYTHONPATH=str(code or ROOT))
    try:
        res = subprocess.run([sys.executable, __file__, "--child", name, str(path)], capture_output=True,
                             text=True, cwd=code or ROOT, env=env, timeout=TIMEOUT)  # a holder's `-c` imports from cwd
    except subprocess.TimeoutExpired:
        return {"error": f"over {TIMEOUT:.0f} s"}
    if res.returncode:
        return {"error": (res.stderr.strip().splitlines() or ["?"])[-1][:200]}
    return json.loads(res.stdout.strip().splitlines()[-1])


def run(workdir: Path, quick: bool, *, sizes: list[int] | None = None, listed: bool = False,
        code: Path | None = None, pipes_max: int = 1_000_000) -> dict:
    from benchmarks import scale_index

    workdir.mkdir(parents=True, exist_ok=True)
    sizes = sizes or ([s for s in SIZES if s <= 10_000] if quick else SIZES)
    series: dict[str, list] = {"episodes": [], "frames": [], "figures": []}
    for n in sizes:
        path = scale_index.make(workdir / f"e{n}", n, length=LENGTH, listed=listed)
        fig: dict = {}
        for name, _, pipes in ROWS:
            if pipes and n > pipes_max:
                continue
            got = measure(name, path, code)
            if name == "open":  # the least of three: the others are the machine's noise
                got = min([got, measure(name, path, code), measure(name, path, code)],
                          key=lambda r: r.get("open_s", 1e9))
            fig.update(got if "error" not in got else {f"{name}_error": got["error"]})
        series["episodes"].append(n)
        series["frames"].append(n * LENGTH)
        series["figures"].append(fig)
        print(f"  {n:>9,} episodes: " + ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                                                  for k, v in fig.items()), flush=True)
        shutil.rmtree(path)
    rows = []
    for n, fig in zip(series["episodes"], series["figures"]):
        for key, unit, scale in (("open_s", "ms", 1e3), ("open_private_mb", "MB", 1), ("shared_private_mb", "MB", 1),
                                 ("lookup_ms", "ms", 1), ("where_s", "ms", 1e3), ("train_build_s", "ms", 1e3),
                                 ("metric_build_s", "ms", 1e3), ("train_full_build_s", "ms", 1e3),
                                 ("train_first_s", "ms", 1e3), ("train_next_s", "ms", 1e3),
                                 ("metric_first_s", "ms", 1e3)):
            if key in fig:
                goal = GOALS.get(key)
                rows.append({"metric": f"{key} at {n:,} episodes ({n * LENGTH:,} frames)", "ours": fig[key] * scale,
                             "baseline": None, "ceiling": None, "unit": unit,
                             "note": f"goal {goal * scale:g} {unit}" if goal else ""})
    return {"section": "scale", "rows": rows, "series": series,
            "intro": "Index costs against episodes (100 frames of 50 KB each, 512 MB sparse shards), each figure "
                     "in a fresh process; see benchmarks/bench_scale.py."}


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = result["series"]
    xs = s["episodes"]
    panels = [("seconds", [("open_s", "open"), ("where_s", "video_pipe(where=)"), ("train_build_s", "train_pipe build"),
                           ("metric_build_s", "metric_pipe build"), ("train_full_build_s", "train_pipe build, full"),
                           ("train_first_s", "first train batch, cold"), ("metric_first_s", "first metric batch, cold"),
                           ("lookup_ms", "lookup (ms)")]),
              ("MB", [("open_private_mb", "private, alone"), ("shared_private_mb", "private, beside a rank"),
                      ("open_anon_mb", "anon")])]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, (unit, keys) in zip(axes, panels):
        for key, label in keys:
            pts = [(x, f[key]) for x, f in zip(xs, s["figures"]) if key in f]
            if pts:
                ax.plot([p[0] for p in pts], [max(p[1], 1e-3) for p in pts], "o-", label=label)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(f"episodes ({LENGTH} frames each)")
        ax.set_ylabel(unit)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].axhline(0.3, color="grey", lw=0.8, ls=":")
    axes[1].axhline(50, color="grey", lw=0.8, ls=":")
    axes[0].set_title("time")
    axes[1].set_title("memory growth at open")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        fn = dict((n, f) for n, f, _ in ROWS)[sys.argv[2]]
        print(json.dumps(fn(sys.argv[3])))
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max", type=int, default=SIZES[-1], help="largest number of episodes")
    ap.add_argument("--listed", action="store_true", help="indexes listing their ids in index.json")
    ap.add_argument("--code", type=Path, default=None, help="the checkout whose episodepipes the children run")
    ap.add_argument("--pipes-max", type=int, default=1_000_000, help="build pipes up to this many episodes")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=None, help="write scale.json and bench_scale.png here")
    a = ap.parse_args()
    work = a.workdir or Path(tempfile.mkdtemp(prefix="bench_scale-"))
    try:
        result = run(work, False, sizes=[s for s in SIZES if s <= a.max], listed=a.listed, code=a.code,
                     pipes_max=a.pipes_max)
    finally:
        if a.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "scale.json").write_text(json.dumps(result, indent=1) + "\n")
        plot(result, a.out / "bench_scale.png")


if __name__ == "__main__":
    main()
