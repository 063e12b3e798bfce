"""Index cost against the number of frames, format v1 against v2, side by side in one run.

For each size a synthetic index (300 frames per episode, no shard files: opening reads none) is written
as v2 and, up to ``--v1-max`` frames, as v1 with the same content. Each measurement runs in a fresh
process: `EpisodeIndex.open` wall time and the growth of the process's memory across it, read from
``/proc/self/smaps_rollup`` (``anon``: heap the process owns, what each rank and worker pays again;
``private``: anon plus file pages only this process maps, i.e. the mapped columns it touched). With
``--cold`` (root only) the page cache is dropped before each v2 open. At the largest v2 size it also
times building ``metric_pipe``, ``video_pipe`` and ``train_pipe``; on small real shards (written by the
project's writer) it times open to first batch for both versions.

    python benchmarks/bench_index.py                 # 10^4 .. 3x10^7 frames, v1 up to 3x10^6
    python benchmarks/bench_index.py --quick         # 10^4 .. 10^6
    python benchmarks/bench_index.py --cold --v1-max 30000000

Writes ``docs/bench_index.png`` (log-log) and ``docs/bench_index.json``; ``run(workdir, quick)`` returns
the rows in the form ``scripts/bench.py`` sections use.
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
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

LENGTH = 300  # frames per episode
FRAME_BYTES = 40_000
PER_SHARD = 40  # episodes per shard
SIZES = [10_000, 100_000, 1_000_000, 3_000_000, 10_000_000, 30_000_000]


def synthetic_v2(root: Path, frames: int) -> Path:
    """A v2 index of ``frames // LENGTH`` episodes (every 10th val), its columns built with numpy."""
    from episodepipes.format import shard_name
    from episodepipes.index import v2 as indexv2

    root.mkdir(parents=True, exist_ok=True)
    n = max(1, frames // LENGTH)
    total = n * LENGTH
    k = np.arange(n, dtype=np.uint64)
    ep = np.zeros((n, 7), np.uint64)
    ep[:, indexv2.FIRST], ep[:, indexv2.LENGTH], ep[:, indexv2.SEGMENT] = k * LENGTH, LENGTH, k
    ep[:, indexv2.SPLIT], ep[:, indexv2.PROMPT] = (k % 10 == 0), k % 20
    seg = np.stack([k // PER_SHARD, k * LENGTH, np.full(n, LENGTH, np.uint64)], axis=1)
    offset = (np.arange(total, dtype=np.uint64) % (PER_SHARD * LENGTH)) * FRAME_BYTES
    cols = {"episodes": ep, "segments": seg, "offset": offset, "size": np.full(total, FRAME_BYTES, "<u4"),
            "crc32": np.random.default_rng(0).integers(0, 2**32, total, dtype=np.uint32)}
    shards = []
    for s in range(-(-n // PER_SHARD)):
        count = min(PER_SHARD, n - s * PER_SHARD) * LENGTH
        shards.append({"name": shard_name(s), "bytes": count * FRAME_BYTES + 1024, "sha256": "0" * 64,
                       "samples": count})
    cam = {"height": 224, "width": 224, "source": "front", "source_height": 480, "source_width": 640}
    schema = {"cameras": {"front": cam, "wrist": dict(cam, source="wrist")},
              "arrays": {"state": {"dtype": "<f4", "shape": [7], "source": "state"},
                         "action": {"dtype": "<f4", "shape": [7], "source": "action"}}}
    meta = {"format": "episodepipes-shards", "version": 2, "layout": "members", "crc32": True, "options": {},
            "shards": shards, "schemas": [schema], "splits": ["train", "val"],
            "prompts": [f"task {t}" for t in range(20)], "fps": [10.0], "ids": [f"ep{i:07d}" for i in range(n)],
            "frames": total, "episode_meta": []}
    indexv2.write(root, meta, cols)
    return root


def as_v1(v2: Path, root: Path) -> Path:
    """The same index in format v1 (every offset in the JSON), as `ShardWriter(version=1)` writes it."""
    from episodepipes.index import EpisodeIndex
    from episodepipes.sharding.write.writer import write_index

    root.mkdir(parents=True, exist_ok=True)
    d = EpisodeIndex.open(v2).data
    write_index(root, d["shards"], d["episodes"], d["options"], version=1)
    return root


def _memory() -> dict[str, float]:
    out = {}
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines()[1:]:
        key, value = line.split(":")
        out[key] = int(value.split()[0]) / 1024  # kB -> MB
    return {"rss": out["Rss"], "private": out["Private_Clean"] + out["Private_Dirty"], "anon": out["Anonymous"]}


def _child(args: list[str]) -> None:
    """Run in a fresh process: print one JSON line of measurements."""
    import gc

    from episodepipes.index import EpisodeIndex

    what, path = args[0], Path(args[1])
    if what == "open":
        gc.collect()
        before = _memory()
        t0 = time.perf_counter()
        index = EpisodeIndex.open(path)
        seconds = time.perf_counter() - t0
        after = _memory()
        grow = {k: after[k] - before[k] for k in after}
        print(json.dumps({"seconds": seconds, **grow, "episodes": len(index.episodes)}))
    elif what == "pipes":
        from episodepipes.pipes import metric_pipe, train_pipe, video_pipe

        index = EpisodeIndex.open(path)
        out = {}
        val = index.split("val")
        for name, build in (
                ("metric_pipe", lambda: metric_pipe(index, frames_per_episode=8, batch_size=32, rank=0, world_size=2)),
                ("video_pipe", lambda: video_pipe(index, episodes=[e.id for e in val[:4]], batch_size=32,
                                                  max_batches=10)),
                ("train_pipe", lambda: train_pipe(index, batch_size=32, seed=0, rank=0, world_size=2))):
            t0 = time.perf_counter()
            pipe = build()
            out[name] = time.perf_counter() - t0
            out[name + "_len"] = len(pipe)
        print(json.dumps(out))
    elif what == "first_batch":
        from episodepipes.pipes import metric_pipe, train_pipe

        t0 = time.perf_counter()
        index = EpisodeIndex.open(path)
        next(iter(metric_pipe(index, frames_per_episode=4, batch_size=8, num_workers=1)))
        metric = time.perf_counter() - t0
        t0 = time.perf_counter()
        next(iter(train_pipe(EpisodeIndex.open(path), batch_size=8, seed=0, num_workers=1)))
        print(json.dumps({"metric_first_batch": metric, "train_first_batch": time.perf_counter() - t0}))


def _measure(what: str, path: Path, *, cold: bool = False) -> dict:
    if cold:
        subprocess.run(["sync"], check=True)
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    res = subprocess.run([sys.executable, __file__, "--child", what, str(path)], capture_output=True, text=True,
                         cwd=ROOT)
    if res.returncode:
        raise RuntimeError(f"{what} {path}: {res.stderr.strip().splitlines()[-1:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def _real_shards(workdir: Path) -> tuple[Path, Path]:
    from episodepipes.sharding.formats.synthetic import SyntheticReader
    from episodepipes.sharding.write.encode import EncodeOptions, encode_episode
    from episodepipes.sharding.write.writer import ShardWriter

    reader = SyntheticReader(num_episodes=20, length=30, height=96, width=128)
    paths = []
    for version in (2, 1):
        out = workdir / f"real-v{version}"
        shutil.rmtree(out, ignore_errors=True)
        with ShardWriter(out, shard_size=1 << 20, options={}, version=version) as w:
            for eid in reader.episode_ids():
                w.add(encode_episode(reader.read(eid), EncodeOptions()))
        paths.append(out)
    return paths[0], paths[1]


def run(workdir: Path, quick: bool, *, v1_max: int = 3_000_000, cold: bool = False,
        sizes: list[int] | None = None) -> dict:
    workdir.mkdir(parents=True, exist_ok=True)
    sizes = sizes or ([s for s in SIZES if s <= 1_000_000] if quick else SIZES)
    series: dict[str, list] = {"frames": [], "v1": [], "v2": [], "v2_cold": []}
    rows = []
    for frames in sizes:
        v2 = synthetic_v2(workdir / f"v2-{frames}", frames)
        r2 = min((_measure("open", v2) for _ in range(3)), key=lambda r: r["seconds"])
        r2c = _measure("open", v2, cold=True) if cold else None
        r1 = None
        if frames <= v1_max:
            v1 = as_v1(v2, workdir / f"v1-{frames}")
            r1 = min((_measure("open", v1) for _ in range(2)), key=lambda r: r["seconds"])
            shutil.rmtree(v1)
        series["frames"].append(frames)
        series["v1"].append(r1)
        series["v2"].append(r2)
        series["v2_cold"].append(r2c)
        cold_note = f"; cold cache {r2c['seconds'] * 1e3:.0f} ms, +{r2c['private']:.0f} MB" if r2c else ""
        rows.append({"metric": f"open {frames:,} frames ({frames // LENGTH:,} episodes)",
                     "ours": r2["seconds"] * 1e3, "baseline": r1["seconds"] * 1e3 if r1 else None, "ceiling": None,
                     "unit": "ms", "note": f"v2 +{r2['anon']:.1f} MB anon / +{r2['private']:.1f} MB private"
                                           + (f"; v1 +{r1['anon']:.0f} MB anon" if r1 else "; v1 not run")
                                           + cold_note})
        if frames == sizes[-1]:
            pipes = _measure("pipes", v2)
            rows.append({"metric": f"build pipes over {frames // LENGTH:,} episodes", "ours": max(
                pipes[k] for k in ("metric_pipe", "video_pipe", "train_pipe")) * 1e3, "baseline": None,
                "ceiling": None, "unit": "ms", "note": ", ".join(
                f"{k} {pipes[k] * 1e3:.0f} ms" for k in ("metric_pipe", "video_pipe", "train_pipe"))})
            series["pipes"] = pipes
        if frames != sizes[-1]:
            shutil.rmtree(v2)
    real2, real1 = _real_shards(workdir)
    fb2, fb1 = _measure("first_batch", real2), _measure("first_batch", real1)
    for key in ("metric_first_batch", "train_first_batch"):
        rows.append({"metric": f"{key.replace('_', ' ')} (600 real frames)", "ours": fb2[key] * 1e3,
                     "baseline": fb1[key] * 1e3, "ceiling": None, "unit": "ms", "note": "open + first batch, v2 vs v1"})
    series["first_batch"] = {"v2": fb2, "v1": fb1}
    return {"section": "index", "rows": rows, "series": series,
            "intro": "EpisodeIndex.open in a fresh process, v2 (JSON + memory-mapped columns) against v1 (one "
                     "JSON with every offset), same content; baseline = v1."}


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = result["series"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for key, label, style in (("v1", "v1 (JSON offsets)", "o-"), ("v2", "v2 warm cache", "s-"),
                              ("v2_cold", "v2 cold cache", "^--")):
        pts = [(f, r) for f, r in zip(s["frames"], s[key]) if r]
        if pts:
            a.plot([f for f, _ in pts], [r["seconds"] for _, r in pts], style, label=label)
            b.plot([f for f, _ in pts], [max(r["anon"], 0.01) for _, r in pts], style, label=label + " anon")
    a.axhline(0.3, color="grey", lw=0.8, ls=":", label="goal 0.3 s")
    b.axhline(100, color="grey", lw=0.8, ls=":", label="goal 100 MB")
    for ax, title, unit in ((a, "EpisodeIndex.open", "seconds"), (b, "memory growth of the process", "MB")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("frames in the index (300 per episode)")
        ax.set_ylabel(unit)
        ax.set_title(title)
        ax.legend(fontsize=8)
        ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(sys.argv[2:])
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="10^4 .. 10^6 frames")
    ap.add_argument("--v1-max", type=int, default=3_000_000, help="largest v1 index to build (default 3x10^6)")
    ap.add_argument("--cold", action="store_true", help="also open each v2 index after dropping the page cache")
    ap.add_argument("--workdir", type=Path, default=None)
    a = ap.parse_args()
    work = a.workdir or Path(tempfile.mkdtemp(prefix="bench_index-"))
    try:
        result = run(work, a.quick, v1_max=a.v1_max, cold=a.cold and os.geteuid() == 0)
    finally:
        if a.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    docs = ROOT / "docs"
    (docs / "bench_index.json").write_text(json.dumps(result, indent=1) + "\n")
    plot(result, docs / "bench_index.png")
    for r in result["rows"]:
        base = f"{r['baseline']:.1f}" if r["baseline"] is not None else "-"
        print(f"{r['metric']:<44} v2 {r['ours']:>9.1f} {r['unit']}  v1 {base:>9} {r['unit']}  {r['note']}")


if __name__ == "__main__":
    main()
