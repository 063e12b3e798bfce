"""Read one episode's first frames for the page: its arrays and a video per camera, reading nothing else.

The frames' byte ranges come from the index's columns (`EpisodeIndex.frame_ranges`); the ranges of one shard that
touch (or are a chunk's framing apart) are read together, at most `PIECE` bytes a read, through the dataset's byte
source: a local folder or a remote root (``s3://``...) alike. `Counts` adds up what was read, so a test can check
that a page of two episodes reads those two episodes' frames and nothing more.

Every frame's bytes are checked against the index's CRC32 before they are parsed. A frame that fails, or does not
parse or decode, is kept as a gap (grey video frame, no array values) and listed, not fatal: a viewer is where a
damaged episode gets looked at.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from episodepipes.codec.chunk import parse_record
from episodepipes.format import npy_header
from episodepipes.index import ArraySpec, Episode, EpisodeIndex
from episodepipes.sharding.show.frames import CameraFrames
from episodepipes.sharding.show.video import Mp4
from episodepipes.tarmembers import frame_fields

log = logging.getLogger(__name__)
_npy_header = functools.lru_cache(maxsize=256)(npy_header)  # numpy's writer costs ~60 us a call

PIECE = 16 << 20  # bytes a read asks for at most (an episode's frames are held one piece at a time)
# bytes between two frames' ranges read rather than split: between frames of one episode in one shard (one segment)
# lie only its chunks' framing (a tar header, a chunk's record table), never another episode's bytes
GAP = 64 << 10


@dataclass
class Counts:
    """What the reads of a page took from the dataset's shards."""

    bytes: int = 0
    reads: int = 0
    shards: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class Shown:
    """One episode as the page shows it.

    Attributes:
        episode: the index's episode.
        frames: how many of its frames are shown (its first ones).
        arrays: name -> float64 values of those frames, ``(frames, *shape)``; NaN where a frame is damaged.
        videos: camera -> its H.264 mp4 bytes.
        damaged: (frame, why) of every frame that failed its check or did not parse or decode.
    """

    episode: Episode
    frames: int
    arrays: dict[str, np.ndarray]
    videos: dict[str, bytes]
    damaged: list[tuple[int, str]]


def _pieces(index: EpisodeIndex, rows: np.ndarray) -> Iterator[tuple[int, int, int, range]]:
    """(shard, start, end, frames) of each read: frames (positions in ``rows``) one read covers."""
    shards, starts, ends = index.frame_ranges(rows)
    shards, starts, ends = shards.tolist(), starts.tolist(), ends.tolist()
    k0 = 0
    for k in range(1, len(rows) + 1):
        if k == len(rows) or shards[k] != shards[k0] or not 0 <= starts[k] - ends[k - 1] <= GAP or \
                ends[k] - starts[k0] > PIECE:
            yield shards[k0], starts[k0], ends[k - 1], range(k0, k)
            k0 = k


def read_episode(index: EpisodeIndex, ep: Episode, *, max_frames: int, counts: Counts) -> Shown:
    """The first ``max_frames`` frames of ``ep``: its arrays and a video per camera.

    Args:
        index: the dataset (local or remote); ep: one of its episodes.
        max_frames: the most frames shown (the page's cap).
        counts: what the reads take is added here.
    """
    n = min(ep.length, max_frames)
    rows = np.arange(ep.rows.start, ep.rows.start + n, dtype=np.int64)
    crcs = index.frame_crcs(rows)
    _, starts, ends = index.frame_ranges(rows)
    packed = index.meta.get("layout") == "packed"
    cams, keys = sorted(ep.cameras), sorted(ep.arrays)
    arrays = {k: np.full((n, *ep.arrays[k].shape), np.nan) for k in keys}
    decoders = {c: CameraFrames(ep.cameras[c]) for c in cams}
    damaged: list[tuple[int, str]] = []
    with contextlib.ExitStack() as stack:
        videos = {c: stack.enter_context(Mp4(ep.fps, ep.cameras[c].height, ep.cameras[c].width)) for c in cams}
        for shard, a, b, frames in _pieces(index, rows):
            name = index.shards[shard].name
            data = memoryview(index.source.read_ranges(name, [(a, b - a)])[0])
            counts.bytes, counts.reads = counts.bytes + len(data), counts.reads + 1
            counts.shards.add(name)
            for t in frames:
                view = data[int(starts[t]) - a:int(ends[t]) - a]
                if crcs is not None and zlib.crc32(view) != int(crcs[t]):
                    got: _Frame | str = "its bytes do not match the index's crc32"
                else:
                    got = _frame(ep, t, view, int(starts[t]), packed, f"shard {index.location(name)}")
                if isinstance(got, str):
                    damaged.append((t, got))
                    for c in cams:
                        decoders[c].lose()
                        videos[c].add(None)
                    continue
                for c in cams:
                    img = decoders[c].frame(t, got.blobs[c], got.backs[c])
                    if img is None:
                        damaged.append((t, f"camera {c!r} does not decode"))
                    videos[c].add(img)
                for k in keys:
                    arrays[k][t] = got.rows[k]
        out = {c: v.finish() for c, v in videos.items()}
    if damaged:
        log.warning("episode %r: %d damaged frames (first: frame %d, %s); check the dataset with episodepipes-shard "
                    "verify", ep.id, len(damaged), damaged[0][0], damaged[0][1])
    return Shown(ep, n, arrays, out, damaged)


@dataclass(frozen=True)
class _Frame:
    blobs: dict[str, list[bytes | memoryview]]  # camera -> its JPEG, or its packets
    backs: dict[str, int]  # camera -> frames before this one its decode starts at
    rows: dict[str, np.ndarray]  # array -> this frame's step


def _frame(ep: Episode, t: int, view: memoryview, start: int, packed: bool, where: str) -> _Frame | str:
    """What frame ``t``'s bytes (``view``, at byte ``start`` of its shard) hold, or why they are not a frame."""
    cams, keys = sorted(ep.cameras), sorted(ep.arrays)
    where = f"{where}: episode {ep.id!r} frame {t}"
    try:
        if packed:
            rec = parse_record(view, len(cams), len(keys), where=where)
            return _Frame({c: list(p) for c, p in zip(cams, rec.cameras)}, dict(zip(cams, rec.backs)),
                          {k: _step(ep.arrays[k], row, raw=True) for k, row in zip(keys, rec.rows)})
        fields, _ = frame_fields(lambda size, off: view[off - start:off - start + size], start, start + len(view),
                                 ep.id, t, where=where)
        blobs, backs = {}, {}
        for c in cams:
            cam = ep.cameras[c]
            member = fields.get(f"{c}.jpg" if cam.codec == "jpeg" else f"{c}.{cam.codec}")
            if member is None:
                return f"it has no member for camera {c!r}"
            blobs[c], backs[c] = [member], t % cam.gop
        steps = {}
        for k in keys:
            if f"{k}.npy" not in fields:
                return f"it has no {k}.npy member"
            steps[k] = _step(ep.arrays[k], fields[f"{k}.npy"], raw=False)
        return _Frame(blobs, backs, steps)
    except ValueError as e:
        return str(e)


def _step(spec: ArraySpec, data: bytes | memoryview, *, raw: bool) -> np.ndarray:
    """One step of an array as float64: a packed row's raw bytes, or an ``.npy`` member with exactly the header the
    writer makes for the index's dtype and shape (anything else is refused, never parsed: a header may declare any
    shape, and allocating it is what a crafted member wants)."""
    dt = np.dtype(spec.dtype)
    nbytes = dt.itemsize * math.prod(spec.shape)
    head = b"" if raw else _npy_header(dt, tuple(spec.shape))
    if len(data) != len(head) + nbytes or bytes(data[:len(head)]) != head:
        raise ValueError(f"array {spec.name!r} is not one {spec.dtype} {spec.shape} step")
    values = np.frombuffer(data, dt, offset=len(head)).reshape(spec.shape)
    return values.real.astype(np.float64) if dt.kind == "c" else values.astype(np.float64)
