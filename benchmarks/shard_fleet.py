"""Fleet-scale bookkeeping of the shard writer and merge, on synthetic tiny frames (`bench_shard` rows).

What is measured is the bookkeeping, not encoding: frames are tiny and their bytes never read.

- Merge: K job folders with v2 indexes of N frames in all (episodes of 200 frames, 10^5 frames a shard, shards as
  sparse files of their recorded size), made directly from numpy columns; ``merge`` (in place, the default) runs in
  a child process, whose wall time and peak RSS (``wait4``) are reported.
- Resume saves: one job's `ShardWriter` fed episodes of 200 tiny frames (2 KB), shards of 10^4 frames, taking a
  snapshot at every shard and saving it as `write_shards` does, after every shard (``--save-every 0``) and at the
  default interval (in the background; ``--modes`` adds no saves and the interval in the writer's thread), one
  after the other; the writer's time in saves and snapshots as a share of the whole write, the saves' own time,
  the progress files' size at the end.
- Writer memory: a child process's `ShardWriter` fed episodes of 200 frames of 64 bytes (each episode's cameras a
  dict of its own, as encoder processes send them); its RSS growth per frame before the index is written, and its
  peak with the index build.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from episodepipes.format import TAR_END, shard_name
from episodepipes.index import v2 as indexv2
from episodepipes.normstats.fields import StatsFields
from episodepipes.normstats.sidefile import NAME as STATS_NAME
from episodepipes.sharding.write.progress import Progress
from episodepipes.sharding.write.saves import SAVE_EVERY, Saves, Snapshot
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


def save_row(workdir: Path, frames: int, every: float | None = SAVE_EVERY, *, background: bool = True) -> dict:
    """All resume saves of one job writing ``frames`` tiny frames, against the whole write: a snapshot at each shard,
    saved every ``every`` seconds and at the last shard, as `write_shards` does (``every=0``: after every shard;
    None: no saves, the baseline for the write's wall time). ``background=False``: each due save in the writer's
    thread, as before saves ran in the background. The figure is the writer's time in snapshots and saves (waits for
    a background save included); the note adds the background saves' own time."""
    out = workdir / f"saves-{frames}-{every}-{background}"
    t_saves, t_bg, logged = [0.0], [0.0], [None]  # seconds: the writer's in saves and snapshots, the saves' own

    def write(snap: Snapshot) -> None:
        t = time.perf_counter()
        prog = Progress(options=OPTIONS, shards=w.shards, episodes=w.episodes, position=snap.position,
                        frame=snap.frame, segments=snap.segments, log=logged[0])
        prog.save(out, upto={"shards": snap.shards, "episodes": snap.episodes})
        logged[0] = prog.log
        t_bg[0] += time.perf_counter() - t

    out.mkdir(parents=True)
    saves = Saves(every or 0.0, write, background=background)

    def on_shard(w: ShardWriter) -> None:
        t = time.perf_counter()
        pend = w.pending or {"segments": [], "frame": 0}
        snap = Snapshot(shards=len(w.shards), episodes=len(w.episodes), skipped=0, position=len(w.episodes),
                        frame=pend["frame"], segments=list(pend["segments"]), splits={}, stats=0)
        if every is not None:
            saves.shard(snap, final=w.pending is None)
        t_saves[0] += time.perf_counter() - t

    t = time.perf_counter()
    with ShardWriter(out, shard_size=10**4 * FRAME, options=OPTIONS, on_shard=on_shard) as w:
        for i in range(frames // LENGTH):
            w.add_frames(*_episode(i))
        size = sum(p.stat().st_size for p in out.glob("_progress*"))
    total = time.perf_counter() - t
    import shutil

    shutil.rmtree(out)
    how = "no saves" if every is None else f"--save-every {every:g}" + ("" if background or not every else
                                                                        ", in the writer's thread")
    return {"metric": f"resume saves of one job writing {frames:.0e} tiny frames, {how}",
            "ours": t_saves[0] / total, "baseline": None, "ceiling": None, "unit": "share of the write",
            "note": f"{saves.count} saves (and {len(w.shards)} snapshots) took {t_saves[0]:.2f} s of the writer's "
                    f"{total:.1f} s write (goal: under 0.01 at 1e7); the saves themselves {t_bg[0]:.2f} s; progress "
                    f"files {size / 1e6:.1f} MB at the end"}


MODES = {"none": (None, True), "0": (0.0, True), "fg": (SAVE_EVERY, False), "bg": (SAVE_EVERY, True)}


def save_rows(workdir: Path, frames: int, modes: tuple[str, ...] = ("0", "bg")) -> list[dict]:
    """`save_row` in each of ``modes``, one after the other in this run: ``none`` (no saves: the write's own time),
    ``0`` (after every shard), ``fg`` (the default interval, in the writer's thread) and ``bg`` (the default)."""
    return [save_row(workdir, frames, MODES[m][0], background=MODES[m][1]) for m in modes]


_MEMORY = """
import os, resource, sys
from episodepipes.sharding.write.writer import ShardWriter
frames, frame, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
length, cams = 200, {"front": {"height": 8, "width": 8, "source": "front", "source_height": 8, "source_width": 8}}
data, sizes = bytes(frame * length), [frame] * length


def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def meta(i):  # an encoder process sends each episode's cameras as a dict of its own
    return {"id": f"ep{i:08d}", "split": "train", "length": length, "fps": 10.0, "prompt": "",
            "cameras": {k: dict(v) for k, v in cams.items()}, "arrays": {}}


with ShardWriter(out, shard_size=10**4 * frame, options={}) as w:
    w.add_frames(meta(0), data, sizes)  # imports and first buffers: not per frame
    before = rss()
    for i in range(1, frames // length):
        w.add_frames(meta(i), data, sizes)
    held = rss() - before
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
print(held, peak)
"""


def memory_child(workdir: Path, frames: int, frame: int = 64) -> tuple[float, float]:
    """(RSS the writer gained per frame before it writes the index, peak RSS gained per frame including the index
    build), of a `ShardWriter` fed ``frames`` frames of ``frame`` bytes in a child process."""
    import shutil

    out = workdir / f"memory-{frames}"
    done = subprocess.run([sys.executable, "-c", _MEMORY, str(frames), str(frame), str(out)], check=True,
                          capture_output=True, text=True, env=dict(os.environ))
    shutil.rmtree(out, ignore_errors=True)
    held, peak = (int(x) for x in done.stdout.split())
    n = max(frames - 200, 1)  # the first episode (200 frames) is the warm-up
    return held / n, peak / n


def memory_row(workdir: Path, frames: int) -> dict:
    """The writer's memory per frame written: RSS growth of a child process (no saves)."""
    held, peak = memory_child(workdir, frames)
    return {"metric": f"writer memory per frame written, {frames:.0e} frames", "ours": held,
            "baseline": None, "ceiling": None, "unit": "bytes/frame",
            "note": f"RSS growth before the index is written (goal: under 20); peak with the index build "
                    f"{peak:.1f} bytes/frame"}


def rows(workdir: Path, quick: bool) -> list[dict]:
    workdir.mkdir(parents=True, exist_ok=True)
    merges = (10**6, 10**7) if quick else (10**6, 10**7, 10**8)
    saves = (10**5,) if quick else (10**5, 10**6)
    out = [merge_row(workdir, n) for n in merges]
    out += [row for n in saves for row in save_rows(workdir, n)]
    out += [memory_row(workdir, n) for n in ((10**6,) if quick else (10**6, 10**7))]
    return out


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory(dir=os.environ.get("SHARD_FLEET_TMP")) as tmp:
        if "--memory" in sys.argv:  # only these rows: --memory 1e6 1e7
            sizes = [int(float(x)) for x in sys.argv[sys.argv.index("--memory") + 1:]]
            print(json.dumps([memory_row(Path(tmp), n) for n in sizes], indent=1))
        elif "--saves" in sys.argv:  # only these rows: --saves 1e6 1e7 [--modes none 0 fg bg]
            args = sys.argv[sys.argv.index("--saves") + 1:]
            cut = args.index("--modes") if "--modes" in args else len(args)
            modes = tuple(args[cut + 1:]) or ("0", "bg")
            sizes = [int(float(x)) for x in args[:cut]]
            print(json.dumps([row for n in sizes for row in save_rows(Path(tmp), n, modes)], indent=1))
        else:
            print(json.dumps(rows(Path(tmp), "--quick" in sys.argv), indent=1))
