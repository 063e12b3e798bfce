"""Scale of the orders: building `train_pipe` (full and block shuffle), `metric_pipe` and a mixture over synthetic
indexes of 10^3..10^6 episodes and 10^5..10^8 frames, each case in a fresh interpreter (its own peak memory).

`synthetic_index` writes an index laid out as the writer lays it (frames back to back in shards of
``shard_bytes``, an episode's frames split into segments where a shard ends) straight from numpy, in seconds at
10^8 frames; the shard files are sparse (zeros), and every frame's crc32 is 0, so a pass reads them and counts each
sample corrupt (``valid=False``) without decoding: what is timed is the planning, the lookups and the reads.
`scale_rows` is what the ``scale`` section of ``scripts/bench.py`` calls.
Run: ``python -m benchmarks.scale_order [--quick]``.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from episodepipes.format import COLUMNS, INDEX_NAME

SCHEMA = {"arrays": {"state": {"dtype": "<f4", "shape": [7], "source": "state"}},
          "cameras": {"front": {"height": 96, "source": "front", "source_height": 96, "source_width": 128,
                                "width": 128}}}
CHUNK = 1 << 22  # frames written at a time


def _write_column(path: Path, dtype: str, shape: tuple[int, ...], fill: Any) -> dict[str, Any]:
    """Write an .npy column chunk by chunk (``fill(a, b)`` gives rows ``a..b``); its JSON entry."""
    arr = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=shape)
    for a in range(0, shape[0], CHUNK):
        arr[a:a + CHUNK] = fill(a, min(a + CHUNK, shape[0]))
    arr.flush()
    del arr
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    return {"dtype": dtype, "shape": list(shape), "sha256": h.hexdigest()}


def synthetic_index(out: Path, *, episodes: int, frames: int, frame_bytes: int = 50_000,
                    shard_bytes: int = 512 << 20, split: str = "train", shard_files: bool = False) -> Path:
    """An index of ``episodes`` episodes of ``frames`` frames in all (lengths differ by at most one), in ``split``.

    Args:
        out: the folder to write (created).
        episodes, frames: the sizes, ``frames >= episodes``.
        frame_bytes: every frame's size.
        shard_bytes: a shard's size (its frames back to back).
        split: every episode's split.
        shard_files: also create the shard files, sparse (for a pass that reads them).
    """
    out.mkdir(parents=True, exist_ok=True)
    per = max(1, shard_bytes // frame_bytes)  # frames per shard
    nshards = -(-frames // per)
    lengths = np.full(episodes, frames // episodes, np.int64)
    lengths[:frames % episodes] += 1
    first = np.zeros(episodes, np.int64)
    np.cumsum(lengths[:-1], out=first[1:])
    seg_start = np.union1d(first, np.arange(0, frames, per, dtype=np.int64))
    seg_count = np.diff(np.append(seg_start, frames))
    ep_seg = np.searchsorted(seg_start, first)
    ep = np.zeros((episodes, 7), np.uint64)
    ep[:, 0], ep[:, 1], ep[:, 2] = first, lengths, ep_seg
    seg = np.stack([seg_start // per, seg_start, seg_count], axis=1).astype(np.uint64)
    cols = {"episodes": _write_column(out / COLUMNS["episodes"][0], "<u8", ep.shape, lambda a, b: ep[a:b]),
            "segments": _write_column(out / COLUMNS["segments"][0], "<u8", seg.shape, lambda a, b: seg[a:b]),
            "offset": _write_column(out / COLUMNS["offset"][0], "<u8", (frames,),
                                    lambda a, b: (np.arange(a, b, dtype=np.uint64) % per) * frame_bytes),
            "size": _write_column(out / COLUMNS["size"][0], "<u4", (frames,), lambda a, b: frame_bytes),
            "crc32": _write_column(out / COLUMNS["crc32"][0], "<u4", (frames,), lambda a, b: 0)}
    sizes = [min(per, frames - s * per) for s in range(nshards)]
    shards = [{"bytes": n * frame_bytes, "name": f"shard-{s:06d}.tar", "samples": n, "sha256": "0" * 64}
              for s, n in enumerate(sizes)]
    if shard_files:
        for s in shards:
            with open(out / s["name"], "wb") as f:
                f.truncate(s["bytes"])
    # the ids as the writer keeps them: mapped columns (`episodepipes.index.idcols`), ep<k:07d> sorting as k does
    ids = np.char.add(b"ep", np.char.zfill(np.arange(episodes).astype("S7"), 7))
    cols["ids"] = _write_column(out / COLUMNS["ids"][0], ids.dtype.str, ids.shape, lambda a, b: ids[a:b])
    cols["id_order"] = _write_column(out / COLUMNS["id_order"][0], "<i8", (episodes,),
                                     lambda a, b: np.arange(a, b, dtype=np.int64))
    cols["attr"] = _write_column(out / COLUMNS["attr"][0], "<u4", (episodes,), lambda a, b: 0)
    data = {"format": "episodepipes-shards", "version": 2, "layout": "members", "crc32": True, "options": {},
            "shards": shards, "schemas": [SCHEMA], "splits": [split], "prompts": ["scale"], "fps": [10.0],
            "attrs": [{}], "frames": frames, "columns": cols}
    (out / INDEX_NAME).write_bytes(json.dumps(data, sort_keys=True, separators=(",", ":")).encode())
    return out


KINDS = ("train_full", "train_block", "metric", "mixture10")
ROOT = Path("/tmp/episodepipes-scale-order")


def data_for(episodes: int, frames: int, split: str) -> Path:
    """The synthetic index of these sizes under `ROOT`, written once."""
    out = ROOT / f"{split}-{episodes}-{frames}-idcols"
    if not (out / INDEX_NAME).exists():
        synthetic_index(out, episodes=episodes, frames=frames, split=split, shard_files=True)
    return out


def opened(kind: str, root: Path) -> Any:
    """The index (or, for a mixture, ten separately opened copies of it) the pipe of ``kind`` is built over."""
    from episodepipes.index import EpisodeIndex

    return [EpisodeIndex.open(root) for _ in range(10)] if kind == "mixture10" else EpisodeIndex.open(root)


def build(kind: str, index: Any, *, rank: int = 0, world_size: int = 8) -> Any:
    """Build the pipe of ``kind`` over ``index`` (from `opened`), as rank ``rank`` of ``world_size``."""
    from episodepipes.pipes import Source, metric_pipe, train_pipe

    if kind == "metric":
        return metric_pipe(index, frames_per_episode=4, batch_size=32, rank=rank, world_size=world_size)
    if kind == "mixture10":
        return train_pipe({f"s{i}": Source(ix, 1 + i) for i, ix in enumerate(index)}, batch_size=32, seed=0,
                          rank=rank, world_size=world_size)
    return train_pipe(index, batch_size=32, seed=0, rank=rank, world_size=world_size,
                      shuffle="block" if kind == "train_block" else "full")


def _case(kind: str, root: str, memory: bool) -> dict[str, Any]:
    """One build in this process, after the imports and the index opens (timed apart: ``open_s``): seconds and
    RSS growth of the build and of the first batch, or (``memory``) tracemalloc's peak MB over the build."""
    import logging
    import resource
    import tracemalloc

    import episodepipes.pipes  # noqa: F401  (torch and the rest: not the build's cost)

    logging.disable(logging.WARNING)  # every synthetic frame is "corrupt": its warnings are not the point
    t0 = time.perf_counter()
    index = opened(kind, Path(root))
    t1 = time.perf_counter()
    if memory:
        tracemalloc.start()
        build(kind, index)
        return {"peak_mb": tracemalloc.get_traced_memory()[1] / 1e6}
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t2 = time.perf_counter()
    pipe = build(kind, index)
    t3 = time.perf_counter()
    rss_build = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    next(iter(pipe))
    t4 = time.perf_counter()
    return {"open_s": t1 - t0, "build_s": t3 - t2, "first_batch_s": t4 - t3, "build_rss_mb": (rss_build - rss) / 1024,
            "rss_mb": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss) / 1024}


def scale_rows(sizes: list[tuple[int, int]] | None = None, kinds: tuple[str, ...] = KINDS,
               timeout: float = 300.0) -> list[dict[str, Any]]:
    """One row per (kind, episodes, frames): build seconds, first batch seconds, peak MB (tracemalloc) and RSS
    growth, each measured in a fresh interpreter; a case past ``timeout`` is reported as such."""
    rows = []
    for episodes, frames in sizes or [(10**3, 10**5), (10**4, 10**6), (10**5, 10**7), (10**6, 10**8)]:
        for kind in kinds:
            root = data_for(episodes, frames, "val" if kind == "metric" else "train")
            row: dict[str, Any] = {"kind": kind, "episodes": episodes, "frames": frames}
            for memory in (False, True):
                try:
                    got = subprocess.run([sys.executable, "-m", "benchmarks.scale_order", "--case", kind, str(root),
                                          "1" if memory else "0"], capture_output=True, text=True, timeout=timeout,
                                         check=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
                    row.update(json.loads(got.stdout.strip().splitlines()[-1]))
                except subprocess.TimeoutExpired:
                    row["timeout_s" if not memory else "peak_timeout_s"] = timeout
                    break
            rows.append(row)
    return rows


def rank_fetch_rows(root: Path, *, world_sizes: tuple[int, ...] = (1, 8, 64), batch_size: int = 32,
                    block_frames: int = 64, window_blocks: int = 8) -> list[dict[str, Any]]:
    """What rank 0 fetches from an object store in an epoch of ``shuffle="block"`` and ``"rank_block"``, counted
    from the orders alone (no I/O): the frames of the whole blocks each window's frames of rank 0 lie in (what
    `block_read.read_window` fetches, window steps aside), against the frames it uses; requests as blocks fetched
    (adjacent blocks would merge into fewer); and the mix, distinct episodes per batch (frames are equal-sized in
    the synthetic index, so frames stand for bytes)."""
    from episodepipes.index import EpisodeIndex
    from episodepipes.pipes.chosen import choose
    from episodepipes.pipes.order.block_order import BlockLayout
    from episodepipes.pipes.order.permute import rank_positions, steps_per_epoch
    from episodepipes.pipes.order.rank_blocks import RankBlockLayout
    from episodepipes.pipes.order.shuffle import FrameTable

    idx = EpisodeIndex.open(root)
    chosen = choose(idx, "train")
    table = FrameTable(chosen.ids, chosen.lengths)
    base = BlockLayout.of_runs(chosen.runs()[0], block_frames=block_frames, window_blocks=window_blocks)
    rows = []
    for world in world_sizes:
        steps = steps_per_epoch(len(table), world_size=world, batch_size=batch_size)
        for kind in ("block", "rank_block"):
            layout = base if kind == "block" else RankBlockLayout.ranked(base, world_size=world, batch_size=batch_size)
            order = layout.order(seed=0, epoch=0)
            p = rank_positions(0, rank=0, world_size=world, batch_size=batch_size, steps=steps)
            flats, windows = order(p), order.window_of(p)
            fetched = blocks = 0
            for w in np.unique(windows).tolist():
                got = np.unique(layout.block_of(flats[windows == w]))
                blocks += len(got)
                fetched += int((layout.block_end(got) - layout.block_start(got)).sum())
            episodes = np.searchsorted(table.starts, flats, side="right").reshape(steps, batch_size)
            mix = float(np.mean([len(np.unique(e)) for e in episodes]))
            rows.append({"kind": kind, "world_size": world, "frames_used": len(flats), "frames_fetched": fetched,
                         "fetch_ratio": fetched / len(flats), "requests_per_frame": blocks / len(flats),
                         "episodes_per_batch": mix})
    return rows


def main() -> None:
    if sys.argv[1:2] == ["--case"]:
        print(json.dumps(_case(sys.argv[2], sys.argv[3], sys.argv[4] == "1")))
        return
    quick = "--quick" in sys.argv
    for row in rank_fetch_rows(data_for(10**4, 10**6, "train")):
        print(json.dumps(row), flush=True)
    sizes = [(10**3, 10**5), (10**4, 10**6)] if quick else None
    for row in scale_rows(sizes):
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
