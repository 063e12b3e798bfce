"""`summarize`, `episode_rows` and `verify` a shard folder (the ``info`` and ``verify`` commands); `summary` and
`episode_data` give the same as plain data for ``info --json``.

Every text the tables show from the dataset (ids, splits, prompts, attributes, camera and array names, errors) comes
with its control characters escaped (`printable`): a dataset may carry terminal escape sequences. The plain data
keeps the text as it is; ``json.dumps`` escapes it."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np

from episodepipes.index import EpisodeIndex
from episodepipes.index.v2 import FIRST, FPS, SCHEMA, SPLIT
from episodepipes.remote.retry import printable


def _cameras(index: EpisodeIndex) -> list[dict]:
    """Each distinct camera (name, size, codec, GOP) and how many episodes have it; ``copied`` when its packets are
    the source's own (``write --codec copy``), not encoded here."""
    t = index.tables
    copied = index.options.get("codec") in ("copy", "reference")
    schema_eps = Counter(t.episodes[:, SCHEMA].tolist())
    cams: Counter = Counter()
    for k, (c, _) in enumerate(t.schemas):
        for name, cam in c.items():
            cams[(name, cam.height, cam.width, cam.codec, cam.gop, copied and cam.codec != "jpeg")] += schema_eps[k]
    return [{"name": n, "height": h, "width": w, "codec": codec, "gop": gop, "copied": cp, "episodes": v}
            for (n, h, w, codec, gop, cp), v in sorted(cams.items())]


def summary(index: EpisodeIndex) -> dict:
    """The ``info`` figures as plain data (``info --json``): the dataset's own text as it is, not escaped."""
    t = index.tables
    codes = t.episodes[:, SPLIT].astype(np.int64)  # per split: a few vectorised passes over the tables
    names = list(t.splits)
    eps = np.bincount(codes, minlength=len(names))
    frames = np.bincount(codes, weights=index.lengths.astype(np.float64), minlength=len(names))
    per_ep = np.add.reduceat(t.size.astype(np.uint64), t.episodes[:, FIRST].astype(np.int64)) if index.frames \
        else np.zeros(0, np.uint64)
    nbytes = np.bincount(codes, weights=per_ep.astype(np.float64), minlength=len(names))
    arrays = {(name, s.dtype, tuple(s.shape)) for _, a in t.schemas for name, s in a.items()}
    fps = Counter(f"{t.fps[k]:g}" for k in t.episodes[:, FPS].tolist())
    return {
        "format": {"version": index.version, "crc32": index.has_crc},
        "episodes": {"total": len(index.episodes), "splits": {names[k]: int(eps[k]) for k in range(len(names))}},
        "frames": {"total": index.frames, "splits": {names[k]: int(frames[k]) for k in range(len(names))}},
        "cameras": _cameras(index),
        "arrays": [{"name": n, "dtype": d, "shape": list(s)} for n, d, s in sorted(arrays)],
        "fps": dict(fps),
        "shards": len(index.shards),
        "bytes": {"total": sum(s.bytes for s in index.shards),
                  "frames_splits": {names[k]: int(nbytes[k]) for k in range(len(names))}},
        "skipped": [{"id": str(s["id"]), "error": str(s["error"])} for s in index.meta.get("skipped", [])],
    }


def _codec(cam: dict) -> str:
    if cam["codec"] == "jpeg":
        return "jpeg"
    return f"{cam['codec']} gop {cam['gop']}" + (" copied" if cam["copied"] else "")


def summarize(index: EpisodeIndex) -> list[tuple[str, str]]:
    """(field, value) rows: format, episodes, frames and bytes per split, cameras and their codecs, arrays, fps,
    skipped."""
    d = summary(index)
    p = printable
    order = sorted(d["episodes"]["splits"], key=p)

    def per_split(values: dict) -> str:
        return ", ".join(f"{p(k)} {values[k]}" for k in order)

    cams: Counter = Counter()
    codecs: Counter = Counter()
    for c in d["cameras"]:
        cams[f"{p(c['name'])} {c['height']}x{c['width']}"] += c["episodes"]
        codecs[f"{p(c['name'])} {_codec(c)}"] += c["episodes"]
    arrays = {f"{p(a['name'])} {a['dtype']}{tuple(a['shape'])}" for a in d["arrays"]}
    size = d["bytes"]["total"]
    crc = "crc32 per frame" if index.has_crc else "no per-frame crc32 (episodepipes-shard upgrade --crc adds them)"
    rows = [
        ("format", f"version {index.version}, {crc}"),
        ("episodes", f"{d['episodes']['total']} ({per_split(d['episodes']['splits'])})"),
        ("frames", f"{d['frames']['total']} ({per_split(d['frames']['splits'])})"),
        ("cameras", ", ".join(f"{k} ({v} ep)" for k, v in sorted(cams.items())) or "-"),
        ("codecs", ", ".join(f"{k} ({v} ep)" for k, v in sorted(codecs.items())) or "-"),
        ("arrays", ", ".join(sorted(arrays)) or "-"),
        ("fps", ", ".join(f"{k} ({v} ep)" for k, v in sorted(d["fps"].items())) or "-"),
        ("shards", f"{d['shards']}" + (f" virtual: the frames are read in place from the dataset's "
                                        f"{len(index.meta['reference']['files'])} video files" if index.referenced
                                        else "")),
        ("bytes", f"{size} ({size / 1e6:.1f} MB; frames: {per_split(d['bytes']['frames_splits'])})"),
    ]
    skipped = d["skipped"]
    rows.append(("skipped", f"{len(skipped)}" + "".join(f"\n  {p(s['id'])}: {p(s['error'])}" for s in skipped)))
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


def episode_data(index: EpisodeIndex) -> list[dict]:
    """(id, split, length, attributes, task) of every episode as plain data, in index order (``info --episodes
    --json``)."""
    meta = index.tables.episode_meta
    return [{"id": e.id, "split": e.split, "length": e.length, "attributes": meta.get(e.number, {}),
             "task": e.prompt} for e in index.episodes]


def _attributes(attrs: dict) -> str:
    # json.dumps escapes C0 controls in values but not C1 (\x9b) or DEL, and not the keys
    return printable(" ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in sorted(attrs.items()))) or "-"


def verify(out: str | Path, *, source_root: str | Path | None = None) -> list[str]:
    """Every problem found, each naming the shard (and episode); an empty list means the output is intact.

    `EpisodeIndex.problems` with ``members=True``: the columns' sha256 (v2), each shard's size and sha256,
    every frame's crc32 (where the index has them), and the tar headers at every indexed frame offset.
    ``source_root``: a ``--codec reference`` index's dataset root (`EpisodeIndex.open`).
    """
    return EpisodeIndex.open(out, source_root=source_root).problems(members=True)
