"""Fleet-scale bookkeeping of the shard writer and merge, on synthetic tiny frames (`bench_shard` rows).

What is measured is the bookkeeping, not encoding: frames are tiny and their bytes never read.

- Merge: K job folders with v2 indexes of N frames in all (episodes of 200 frames, 10^5 frames a shard, shards as
  sparse files of their recorded size), made directly from numpy columns; ``merge`` (in place, the default) runs in
  a child process, whose wall time and peak RSS (``wait4``) are reported.
- Resume saves: one job's `ShardWriter` fed episodes of 200 tiny frames (2 KB), shards of 10^4 frames, saving
  its progress after every shard as `write_shards` does; the time of all saves against the whole write, the
  progress file's size at the end, and the writer's Python memory per frame (tracemalloc, a separate run).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

from episodepipes.format import TAR_END, shard_name
from episodepipes.index import v2 as indexv2
from episodepipes.normstats.fields import StatsFields
from episodepipes.normstats.sidefile import NAME as STATS_NAME
from episodepipes.sharding.write.progress import Progress
from episodepipes.sharding.write.shards import job_dir, source_fingerprint
from episodepipes.sharding.write.writer import ShardWriter

LENGTH = 200
FRAME = 2048  # at least the tar headers of a frame's members (the index check)
SCHEMA = {"arrays": {}, "cameras": {"front": {"height": 8, "width": 8, "source": "front", "source_height": 8,
                                              "source_width": 8}}}
OPTIONS = {"format": "synthetic", "jpeg_quality": 90, "resize": None, "seed": 0, "shard_size": 10**6,
           "val_episodes": None, "val_fraction": None}


def make_jobs(out: Path, frames: int, k: int, *, shard_frames: int = 10**5) -> None:
    """K finished job folders under ``out/_jobs`` holding ``frames`` frames in all (see the module doc)."""
    episodes = frames // LENGTH
    ids = [f"ep{i:08d}" for i in range(episodes)]
    source = source_fingerprint(ids, OPTIONS, k)
    per_shard = shard_frames // LENGTH
    for j in range(k):
        a, b = j * episodes // k, (j + 1) * episodes // k
        n = b - a
        d = job_dir(out, j)
        d.mkdir(parents=True)
        e = np.arange(n, dtype=np.uint64)
        ep = np.zeros((n, 7), np.uint64)
        ep[:, 0], ep[:, 1], ep[:, 2] = e * LENGTH, LENGTH, e
        seg = np.stack([e // per_shard, e * LENGTH, np.full(n, LENGTH, np.uint64)], 1)
        rows = np.arange(n * LENGTH, dtype=np.uint64)
        cols = {"episodes": ep, "segments": seg, "offset": (rows % (per_shard * LENGTH)) * FRAME,
                "size": np.full(n * LENGTH, FRAME, np.uint32), "crc32": np.zeros(n * LENGTH, np.uint32)}
        shards = []
        for s in range(-(-n // per_shard)):
            count = min(per_shard, n - s * per_shard) * LENGTH
            size = count * FRAME + len(TAR_END)
            with open(d / shard_name(s), "wb") as f:
                f.truncate(size)  # sparse: the merge renames, never reads
            shards.append({"name": shard_name(s), "bytes": size, "sha256": "0" * 64, "samples": count})
        data = {"format": "episodepipes-shards", "version": 2, "layout": "members", "crc32": True, "options": OPTIONS,
                "shards": shards, "schemas": [SCHEMA], "splits": ["train"], "prompts": [""], "fps": [10.0],
                "ids": ids[a:b], "frames": n * LENGTH, "episode_meta": [],
                "job": {"index": j, "num_jobs": k, "episodes": episodes, "first": a, "count": n, "ids": ids[a:b],
                        "source": source}, **StatsFields().write(d / STATS_NAME)}
        indexv2.write(d, data, cols)


def merge_child(out: Path) -> tuple[float, float]:
    """(wall seconds, peak RSS in bytes) of ``merge_jobs(out)`` in a child process."""
    code = "import sys; from episodepipes.sharding.merge import merge_jobs; merge_jobs(sys.argv[1])"
    t = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", code, str(out)], env=dict(os.environ))
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"merge of {out} failed ({proc.returncode})")
    return wall, usage.ru_maxrss * 1024


def merge_row(workdir: Path, frames: int, k: int = 4) -> dict:
    out = workdir / f"merge-{frames}"
    make_jobs(out, frames, k)
    wall, rss = merge_child(out)
    moved = sum(p.stat().st_blocks for p in out.glob("shard-*.tar"))  # sparse shards stay sparse: no copy
    import shutil

    shutil.rmtree(out)
    return {"metric": f"merge in place: {k} jobs, {frames:.0e} frames", "ours": wall, "baseline": None,
            "ceiling": None, "unit": "s",
            "note": f"peak RSS {rss / 1e9:.2f} GB (goal: under 60 s and 2 GB at 1e8); {moved} shard blocks "
                    "allocated after the merge (sparse inputs: 0 means no byte copied)"}


def _episode(i: int) -> tuple[dict, bytes, list[int]]:
    meta = {"id": f"ep{i:08d}", "split": "train", "length": LENGTH, "fps": 10.0, "prompt": "",
            "cameras": SCHEMA["cameras"], "arrays": {}}
    return meta, bytes(FRAME * LENGTH), [FRAME] * LENGTH


def save_row(workdir: Path, frames: int) -> dict:
    """All resume saves of one job writing ``frames`` tiny frames, against the whole write."""
    out = workdir / f"saves-{frames}"
    saves: list = [0.0, 0, None]  # seconds, count, the log state the last save left (as `write_shards` keeps it)

    def save(w: ShardWriter) -> None:
        t = time.perf_counter()
        pend = w.pending or {"segments": [], "frame": 0}
        prog = Progress(options=OPTIONS, shards=w.shards, episodes=w.episodes, position=len(w.episodes),
                        frame=pend["frame"], segments=pend["segments"])
        if hasattr(prog, "log"):  # the append-only log (an episodepipes before it rewrote the whole file)
            prog.log = saves[2]
        prog.save(out)
        saves[2] = getattr(prog, "log", None)
        saves[0] += time.perf_counter() - t
        saves[1] += 1

    t = time.perf_counter()
    with ShardWriter(out, shard_size=10**4 * FRAME, options=OPTIONS, on_shard=save) as w:
        for i in range(frames // LENGTH):
            w.add_frames(*_episode(i))
        size = sum(p.stat().st_size for p in out.glob("_progress*"))
    total = time.perf_counter() - t
    import shutil

    shutil.rmtree(out)
    return {"metric": f"resume saves of one job writing {frames:.0e} tiny frames", "ours": saves[0] / total,
            "baseline": None, "ceiling": None, "unit": "fraction of the write",
            "note": f"{saves[1]} saves took {saves[0]:.1f} s of a {total:.1f} s write (goal: under 0.01 at 1e7); "
                    f"progress files {size / 1e6:.1f} MB at the end"}


def memory_row(workdir: Path, frames: int) -> dict:
    """The writer's Python memory per frame written (tracemalloc; no saves)."""
    out = workdir / f"memory-{frames}"
    tracemalloc.start()
    with ShardWriter(out, shard_size=10**4 * FRAME, options=OPTIONS) as w:
        for i in range(frames // LENGTH):
            w.add_frames(*_episode(i))
        held = tracemalloc.get_traced_memory()[0]  # before `close` writes the index
    tracemalloc.stop()
    import shutil

    shutil.rmtree(out, ignore_errors=True)
    return {"metric": f"writer memory per frame written, {frames:.0e} frames", "ours": held / frames,
            "baseline": None, "ceiling": None, "unit": "bytes/frame",
            "note": "tracemalloc, Python objects the writer holds before it writes the index (goal: under 20)"}


def rows(workdir: Path, quick: bool) -> list[dict]:
    workdir.mkdir(parents=True, exist_ok=True)
    merges = (10**6, 10**7) if quick else (10**6, 10**7, 10**8)
    saves = (10**5,) if quick else (10**5, 10**6)
    out = [merge_row(workdir, n) for n in merges]
    out += [save_row(workdir, n) for n in saves]
    out.append(memory_row(workdir, 10**5))
    return out


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        print(json.dumps(rows(Path(tmp), "--quick" in sys.argv), indent=1))
