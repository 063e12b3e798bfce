"""A synthetic shard folder of any size, laid out as the writer lays it, made in seconds: for the ``scale`` section.

Every frame takes 50 KB of a 512 MB shard (members layout: a frame's tar members, headers and padding included),
episodes of ``length`` frames follow one another, whole, through the shards, and each shard file is sparse (made by
``truncate``: 10**8 frames is 5 TB on paper and a few KB on disk). The columns are streamed to disk a block of
episodes at a time with their sha256, so 10**8 frames need no more than a few MB of memory. ``listed=True`` writes
the layout older writers wrote (ids and attributes listed in ``index.json``), to measure such an index, or the code
on main, on the same content.

    python benchmarks/scale_index.py OUT --episodes 1000000 [--length 100] [--listed]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

FRAME_BYTES = 50 * 1024  # a frame's members (a 224x224 JPEG per camera, two arrays, headers): a multiple of 512
SHARD_BYTES = 512 << 20
TASKS = 20
ROBOTS = ("franka", "ur5", "aloha", "widowx")
_BLOCK = 1 << 16  # episodes per block written


def _column(path: Path, dtype: str, shape: tuple[int, ...], blocks: Iterator[np.ndarray]) -> dict:
    """Write one .npy column from its blocks (as `episodepipes.format.npy_bytes` would whole); its JSON entry."""
    from episodepipes.format import npy_header

    sha = hashlib.sha256()
    with open(path, "wb") as f:
        head = npy_header(np.dtype(dtype), shape)
        f.write(head)
        sha.update(head)
        for b in blocks:
            raw = np.ascontiguousarray(b, dtype=dtype).tobytes()
            f.write(raw)
            sha.update(raw)
    return {"dtype": dtype, "shape": list(shape), "sha256": sha.hexdigest()}


def make(out: Path, episodes: int, *, length: int = 100, listed: bool = False, attrs: bool = True) -> Path:
    """Write the folder; returns it. Episode ``k`` is ``ep<k:07d>``, every 10th in ``val``, one of `TASKS` prompts,
    with ``{"robot": ROBOTS[k % 4]}`` as its attributes when ``attrs``."""
    from episodepipes.format import COLUMNS, TAR_END, shard_name

    out.mkdir(parents=True, exist_ok=True)
    per_shard = max(1, SHARD_BYTES // (length * FRAME_BYTES))  # whole episodes per shard
    frames = episodes * length
    n_shards = -(-episodes // per_shard)

    def blocks(fn: Callable[[np.ndarray], np.ndarray], unit: int) -> Iterator[np.ndarray]:
        total, per = episodes * unit, _BLOCK * unit  # unit: rows per episode (1, or its frames)
        for a in range(0, total, per):
            yield fn(np.arange(a, min(a + per, total), dtype=np.uint64))

    def ep_rows(k: np.ndarray) -> np.ndarray:
        return np.stack([k * length, np.full(len(k), length, np.uint64), k, np.zeros(len(k), np.uint64),
                         (k % 10 == 0).astype(np.uint64), k % TASKS, np.zeros(len(k), np.uint64)], axis=1)

    def seg_rows(k: np.ndarray) -> np.ndarray:
        return np.stack([k // per_shard, k * length, np.full(len(k), length, np.uint64)], axis=1)

    def offsets(r: np.ndarray) -> np.ndarray:
        k = r // length
        return ((k % per_shard) * length + r % length) * FRAME_BYTES

    cols = {
        "episodes": _column(out / COLUMNS["episodes"][0], "<u8", (episodes, 7), blocks(ep_rows, 1)),
        "segments": _column(out / COLUMNS["segments"][0], "<u8", (episodes, 3), blocks(seg_rows, 1)),
        "offset": _column(out / COLUMNS["offset"][0], "<u8", (frames,), blocks(offsets, length)),
        "size": _column(out / COLUMNS["size"][0], "<u4", (frames,),
                        blocks(lambda r: np.full(len(r), FRAME_BYTES, np.uint32), length)),
        "crc32": _column(out / COLUMNS["crc32"][0], "<u4", (frames,),
                         blocks(lambda r: (r * 2654435761 % 2**32).astype(np.uint32), length)),
    }
    meta: dict = {"format": "episodepipes-shards", "version": 2, "layout": "members", "crc32": True, "options": {},
                  "schemas": [_schema()], "splits": ["train", "val"], "prompts": [f"task {t}" for t in range(TASKS)],
                  "fps": [10.0], "frames": frames}
    shards = []
    for s in range(n_shards):
        count = min(per_shard, episodes - s * per_shard) * length
        size = count * FRAME_BYTES + len(TAR_END)
        path = out / shard_name(s)
        with open(path, "wb") as f:
            f.truncate(size)  # sparse: no disk
        shards.append({"name": shard_name(s), "bytes": size, "sha256": "0" * 64, "samples": count})
    meta["shards"] = shards
    ids = [f"ep{k:07d}" for k in range(episodes)]
    if listed:
        meta["ids"] = ids
        meta["episode_meta"] = [[k, {"robot": ROBOTS[k % 4]}] for k in range(episodes)] if attrs else []
    else:
        meta["attrs"] = [{}] + ([{"robot": r} for r in ROBOTS] if attrs else [])
        width = max(len(i) for i in ids)
        # ep<k:07d> sort as their numbers do: the sorted order is the index order
        cols["ids"] = _column(out / COLUMNS["ids"][0], f"|S{width}", (episodes,),
                              iter([np.array(ids, dtype=f"S{width}")]))
        cols["id_order"] = _column(out / COLUMNS["id_order"][0], "<i8", (episodes,),
                                   blocks(lambda k: k.astype(np.int64), 1))
        cols["attr"] = _column(out / COLUMNS["attr"][0], "<u4", (episodes,),
                               blocks(lambda k: (k % 4 + 1 if attrs else k * 0).astype(np.uint32), 1))
    raw = json.dumps(dict(meta, columns=cols), sort_keys=True, separators=(",", ":")).encode()
    tmp = out / "index.json.tmp"
    tmp.write_bytes(raw)
    os.replace(tmp, out / "index.json")
    return out


def _schema() -> dict:
    cam = {"height": 224, "width": 224, "source": "front", "source_height": 480, "source_width": 640}
    return {"cameras": {"front": cam, "wrist": dict(cam, source="wrist")},
            "arrays": {"state": {"dtype": "<f4", "shape": [7], "source": "state"},
                       "action": {"dtype": "<f4", "shape": [7], "source": "action"}}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--episodes", type=int, default=1000)
    ap.add_argument("--length", type=int, default=100)
    ap.add_argument("--listed", action="store_true", help="ids and attributes in index.json, as older writers did")
    a = ap.parse_args()
    make(a.out, a.episodes, length=a.length, listed=a.listed)


if __name__ == "__main__":
    main()
