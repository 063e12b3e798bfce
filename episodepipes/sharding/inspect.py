"""`summarize`, `episode_rows` and `verify` a shard folder (the ``info`` and ``verify`` commands).

Every text they show from the dataset (ids, splits, prompts, attributes, camera and array names, errors) comes
with its control characters escaped (`printable`): a dataset may carry terminal escape sequences."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np

from episodepipes.index import EpisodeIndex
from episodepipes.index.v2 import FIRST, FPS, SCHEMA, SPLIT
from episodepipes.remote.retry import printable


def summarize(index: EpisodeIndex) -> list[tuple[str, str]]:
    """(field, value) rows: format, episodes, frames and bytes per split, cameras, arrays, fps, skipped."""
    t = index.tables
    codes = t.episodes[:, SPLIT]  # per split: a few vectorised passes over the tables, no Episode objects
    names = [printable(n) for n in t.splits]
    eps = np.bincount(codes.astype(np.int64), minlength=len(names))
    frames = np.bincount(codes.astype(np.int64), weights=index.lengths.astype(np.float64), minlength=len(names))
    per_ep = np.add.reduceat(t.size.astype(np.uint64), t.episodes[:, FIRST].astype(np.int64)) if index.frames \
        else np.zeros(0, np.uint64)
    nbytes = np.bincount(codes.astype(np.int64), weights=per_ep.astype(np.float64), minlength=len(names))
    order = sorted(range(len(names)), key=names.__getitem__)
    schema_eps = Counter(t.episodes[:, SCHEMA].tolist())
    cams, arrays = Counter(), set()
    for k, (c, a) in enumerate(t.schemas):
        for name, cam in c.items():
            cams[f"{printable(name)} {cam.height}x{cam.width}"] += schema_eps[k]
        arrays |= {f"{printable(name)} {s.dtype}{s.shape}" for name, s in a.items()}
    fps = Counter(f"{t.fps[k]:g}" for k in t.episodes[:, FPS].tolist())
    size = sum(s.bytes for s in index.shards)
    crc = "crc32 per frame" if index.has_crc else "no per-frame crc32 (episodepipes-shard upgrade --crc adds them)"
    rows = [
        ("format", f"version {index.version}, {crc}"),
        ("episodes", f"{len(index.episodes)} (" + ", ".join(f"{names[k]} {int(eps[k])}" for k in order) + ")"),
        ("frames", f"{index.frames} (" + ", ".join(f"{names[k]} {int(frames[k])}" for k in order) + ")"),
        ("cameras", ", ".join(f"{k} ({v} ep)" for k, v in sorted(cams.items())) or "-"),
        ("arrays", ", ".join(sorted(arrays)) or "-"),
        ("fps", ", ".join(f"{k} ({v} ep)" for k, v in sorted(fps.items())) or "-"),
        ("shards", f"{len(index.shards)}"),
        ("bytes", f"{size} ({size / 1e6:.1f} MB; frames: "
                  + ", ".join(f"{names[k]} {int(nbytes[k])}" for k in order) + ")"),
    ]
    skipped = index.meta.get("skipped", [])
    rows.append(("skipped", f"{len(skipped)}" + "".join(f"\n  {printable(str(s['id']))}: {printable(str(s['error']))}"
                                                      for s in skipped)))
    return rows


def episode_rows(index: EpisodeIndex) -> list[tuple[str, ...]]:
    """A header and (id, split, length, task) of every episode, in index order (``info --episodes``); with an
    ``attributes`` column before the task (``robot="franka" success=true``) when some episode has attributes.
    Each cell is one line with its control characters escaped."""
    meta = index.tables.episode_meta  # episode number -> attributes, only for episodes that have some
    if not meta:
        return [("id", "split", "length", "task"),
                *((printable(e.id), printable(e.split), str(e.length), printable(e.prompt)) for e in index.episodes)]
    return [("id", "split", "length", "attributes", "task"),
            *((printable(e.id), printable(e.split), str(e.length), _attributes(meta.get(e.number, {})),
               printable(e.prompt)) for e in index.episodes)]


def _attributes(attrs: dict) -> str:
    # json.dumps escapes C0 controls in values but not C1 (\x9b) or DEL, and not the keys
    return printable(" ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in sorted(attrs.items()))) or "-"


def verify(out: str | Path) -> list[str]:
    """Every problem found, each naming the shard (and episode); an empty list means the output is intact.

    `EpisodeIndex.problems` with ``members=True``: the columns' sha256 (v2), each shard's size and sha256,
    every frame's crc32 (where the index has them), and the tar headers at every indexed frame offset.
    """
    return EpisodeIndex.open(out).problems(members=True)
