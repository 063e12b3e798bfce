"""`summarize` and `verify` a shard folder (the ``info`` and ``verify`` commands), read through `EpisodeIndex`."""

from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path

from episodepipes.index import EpisodeIndex, Segment
from episodepipes.tarmembers import frame_fields


def summarize(data: dict) -> list[tuple[str, str]]:
    """(field, value) rows: episodes, frames, splits, cameras, bytes, fps, skipped."""
    eps = data["episodes"]
    splits = Counter(e["split"] for e in eps)
    frames = Counter()
    for e in eps:
        frames[e["split"]] += e["length"]
    cams = Counter(f"{c} {v['height']}x{v['width']}" for e in eps for c, v in e["cameras"].items())
    fps = Counter(f"{e['fps']:g}" for e in eps)
    arrays = sorted({f"{k} {a['dtype']}{tuple(a['shape'])}" for e in eps for k, a in e["arrays"].items()})
    size = sum(s["bytes"] for s in data["shards"])
    rows = [
        ("episodes", f"{len(eps)} (" + ", ".join(f"{k} {v}" for k, v in sorted(splits.items())) + ")"),
        ("frames", f"{sum(frames.values())} (" + ", ".join(f"{k} {v}" for k, v in sorted(frames.items())) + ")"),
        ("cameras", ", ".join(f"{k} ({v} ep)" for k, v in sorted(cams.items())) or "-"),
        ("arrays", ", ".join(arrays) or "-"),
        ("fps", ", ".join(f"{k} ({v} ep)" for k, v in sorted(fps.items())) or "-"),
        ("shards", f"{len(data['shards'])}"),
        ("bytes", f"{size} ({size / 1e6:.1f} MB)"),
    ]
    skipped = data.get("skipped", [])
    rows.append(("skipped", f"{len(skipped)}" + "".join(f"\n  {s['id']}: {s['error']}" for s in skipped)))
    return rows


def verify(out: str | Path) -> list[str]:
    """Every problem found, each naming the shard (and episode); an empty list means the output is intact.

    Checks each shard's size and sha256 and every frame's crc32 (where the index has them), then parses
    the tar header at every indexed frame offset and checks that the members up to the frame's end belong
    to that episode and frame. Only the index's own shard names are opened (`EpisodeIndex` checks them).
    """
    index = EpisodeIndex.open(out)  # a local folder, or a remote root read through its byte source
    problems: list[str] = []
    for i, s in enumerate(index.shards):
        eps = ", ".join(dict.fromkeys(e.id for e, _ in index.segments_in(i))) or "none"
        size = index.shard_size(i)
        if size is None:
            problems.append(f"shard {s.name} is missing (episodes {eps}); restore it or re-shard")
            continue
        if size != s.bytes:
            problems.append(f"shard {s.name} has {size} bytes, index says {s.bytes} (episodes {eps}); truncated? "
                            "re-shard")
        with index.shard_bytes(i) as view:
            if size == s.bytes and hashlib.sha256(view).hexdigest() != s.sha256:
                problems.append(f"shard {s.name}: sha256 mismatch (episodes {eps}); the file changed, re-shard")
            problems += [f"shard {s.name}: episode {eid!r} frame {frame}: crc32 mismatch, its bytes changed; "
                         "restore the shard or re-shard" for eid, frame in index.bad_frames(i, view)]
            for e, seg in index.segments_in(i):
                problems += _check_frames(view, s.name, e.id, seg)
    return problems


def _check_frames(view: memoryview, name: str, eid: str, seg: Segment) -> list[str]:
    """Parse every frame's members at its indexed byte range, with the same parser the pipes read with."""
    for k, (start, end) in enumerate(zip(seg.offsets, (*seg.offsets[1:], seg.end))):
        frame = seg.first + k
        try:
            frame_fields(lambda size, off: bytes(view[off:off + size]), start, end, eid, frame,
                         where=f"shard {name}: episode {eid!r} frame {frame}")
        except ValueError as e:
            return [str(e)]
    return []
