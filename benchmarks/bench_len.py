"""``len()`` of metric and video pipes from 10 to 10,000 episodes: it must be free and flat.

The index is built in memory (no frames encoded): `len()` reads nothing but the plan, which the pipe
fixes at construction. The baseline is what a naive loader pays to learn its length: building the
metric plan (choosing and splitting the frames) on every call.
"""

from __future__ import annotations

import time
from pathlib import Path

from episodepipes.format import FORMAT_NAME
from episodepipes.pipes import EpisodeIndex, metric_pipe, video_pipe
from episodepipes.pipes.plan import metric_items, split_even


def synthetic_index(root: Path, episodes: int, *, length: int = 50, frame_bytes: int = 60_000,
                    per_shard: int = 20) -> EpisodeIndex:
    """An `EpisodeIndex` over ``episodes`` fictitious episodes with realistic segments (no files)."""
    shards, eps = [], []
    for i in range(episodes):
        shard, pos = divmod(i, per_shard)
        base = pos * length * frame_bytes
        eps.append({"id": f"ep{i:06d}", "split": "val", "length": length, "fps": 10.0, "prompt": "p",
                    "cameras": {"front": {"height": 480, "width": 640}}, "arrays": {"state": {
                        "dtype": "float32", "shape": [7]}},
                    "segments": [{"shard": shard, "first": 0, "count": length,
                                  "offsets": [base + f * frame_bytes for f in range(length)],
                                  "end": base + length * frame_bytes}]})
    for s in range(-(-episodes // per_shard)):
        in_shard = min(per_shard, episodes - s * per_shard)  # the last shard may hold fewer episodes
        shards.append({"name": f"shard-{s:06d}.tar", "bytes": per_shard * length * frame_bytes, "sha256": "0" * 64,
                       "samples": in_shard * length})
    return EpisodeIndex(root, {"format": FORMAT_NAME, "version": 1, "options": {},
                               "shards": shards, "episodes": eps})


def _per_call(fn: object, reps: int) -> float:
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()  # type: ignore[operator]
        best = min(best, (time.perf_counter() - t0) / reps)
    return best


def run(workdir: Path, quick: bool) -> dict:
    sizes = [10, 100, 1000, 10_000] if not quick else [10, 1000, 10_000]
    rows, xs, len_us, naive_us, build_ms = [], [], [], [], []
    for n in sizes:
        index = synthetic_index(workdir, n)
        t0 = time.perf_counter()
        pipe = metric_pipe(index, frames_per_episode=8, batch_size=32, rank=1, world_size=4)
        build = time.perf_counter() - t0
        video = video_pipe(index, episodes=[index.episodes[0].id, index.episodes[-1].id], batch_size=16,
                           max_batches=5)
        ours = _per_call(lambda p=pipe: len(p), 2000)
        ours_v = _per_call(lambda p=video: len(p), 2000)
        naive = _per_call(lambda i=index: len(split_even(metric_items(i.split("val"), 8), rank=1, world_size=4)),
                          1 if n >= 1000 else 20)
        xs.append(n)
        len_us.append(max(ours, ours_v) * 1e6)
        naive_us.append(naive * 1e6)
        build_ms.append(build * 1e3)
        rows.append({"metric": f"len() at {n:,} episodes", "ours": max(ours, ours_v) * 1e6, "baseline": naive * 1e6,
                     "ceiling": None, "unit": "µs",
                     "note": f"metric and video pipes; goal < 1000 µs, flat; "
                             f"metric_pipe() built in {build * 1e3:.1f} ms"})
    flat = max(len_us) / min(len_us)
    rows.append({"metric": "len() largest / smallest index", "ours": flat, "baseline": max(naive_us) / min(naive_us),
                 "ceiling": None, "unit": "ratio", "note": "1.0 = flat"})
    return {"section": "len", "rows": rows,
            "intro": "len() is fixed from the plan when the pipe is built; it never reads, iterates or starts "
                     "a worker.",
            "series": {"episodes": xs, "len_us": len_us, "naive_us": naive_us, "build_ms": build_ms}}
