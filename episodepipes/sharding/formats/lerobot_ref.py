"""``write --format lerobot --codec reference``: index a LeRobot dataset in place, writing no frame.

The index is the one ``--codec copy`` writes (the same records, CRC32s, key frames and shard sha256s, so every pipe
reads it alike), but its shards are virtual (`episodepipes.codec.reference`): each packet stays in the dataset's own
mp4, named relative to the dataset root, and only the bytes around the packets (tar and pack framing, the arrays'
rows) are kept, in ``reference.literal.bin`` beside the index. Frames are matched to rows as the copy import matches
them (LeRobot's closest-frame rule on demuxed timestamps, one packet per row; episodes starting mid-GOP keep the
packets from the keyframe before them), so a frame is exactly what a decode of the whole source file gives.

Each mp4 is demuxed once (timestamps, byte positions, keyframes), and its bytes are read once for the records' CRC32s
and the shards' sha256; each parquet file is read once. Each source file's size and the CRC32 of its first and last
64 KiB are kept, so a file replaced after indexing is refused by name before its frames are used.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from episodepipes.codec.copy import MAX_GOP
from episodepipes.format import safe_episode_id
from episodepipes.sharding.episode import EpisodeError
from episodepipes.sharding.formats import lerobot as lr
from episodepipes.sharding.formats import lerobot_meta as meta
from episodepipes.sharding.formats.reference_build import SHARD_SIZE, Builder, Camera, Video, check_out
from episodepipes.sharding.formats.reference_images import ParquetImages
from episodepipes.sharding.write.plan import assign_splits

log = logging.getLogger(__name__)



@dataclass
class ReferenceResult:
    """What `index_lerobot` wrote: the folder, episodes, frames, virtual shards, and the seconds it took."""

    out: Path
    episodes: int
    frames: int
    shards: int
    seconds: float
    source_bytes: int
    written_bytes: int


def _match(v: Video, start: float, end: float | None, times: np.ndarray, fps: float, tol: float,
           where: str) -> tuple[int, int, int]:
    """(first packet kept, packets kept, lead) of an episode's camera: what `codec.copy.VideoSource.take` and the
    LeRobot reader's copy keep, checked the same way (one packet per row, in order)."""
    half = 0.5 / fps
    if not len(times):
        raise EpisodeError(f"{where}: the episode has no rows, so no frames to index")
    lo, hi = start + float(times.min()), start + float(times.max())
    keep = np.flatnonzero((v.times >= lo - v.half) & (v.times < hi + 2 * half - v.half))
    if not len(keep):
        raise EpisodeError(f"{where}: no frame lies within [{lo}, {hi + 2 * half}) s; check the episode's timestamps")
    first, last = int(keep[0]), int(keep[-1])
    k0 = int(v.key_of[first])
    if k0 < 0:
        raise EpisodeError(f"{where}: frame at {v.times[first]:.3f}s has no keyframe before it; re-encode it")
    gop = int((np.arange(k0, last + 1) - v.key_of[k0:last + 1]).max()) + 1
    if gop > MAX_GOP:
        raise EpisodeError(f"{where}: its keyframes are up to {gop} frames apart, more than {MAX_GOP}, so a random "
                           "read would decode that many frames; re-encode it with --codec av1 (short GOPs)")
    shown = v.times[k0:last + 1]
    span = np.flatnonzero((shown >= start - half) & (shown < (np.inf if end is None else end - half)))
    taken = span[lr.closest(shown[span], start + times, start, tol, where)]
    if np.any(np.diff(taken) != 1) or last - first + 1 != len(times) or taken[0] != first - k0:
        raise EpisodeError(f"{where}: the rows do not take one frame each in order, so the video cannot be "
                           "referenced frame for row; re-encode it with --codec av1")
    return k0, last + 1 - k0, first - k0


def _tables(reader: lr.LeRobotReader, rel: str, where: str):  # noqa: ANN202 (pyarrow.Table)
    """A data file's rows, sorted by episode and frame, read once: one open for the schema and the columns, decoded
    on this thread (a data file is small: a thread pool costs more than it saves), without pyarrow's pre-buffering
    (coalesced reads are for object stores; a local file pays a copy for them), sorted only when they are not."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = meta.regular_file(meta.inside(reader.root.resolve(), rel, where, EpisodeError), where, EpisodeError)
    cols = ["timestamp", "frame_index", "episode_index", "task_index", *reader.array_keys]
    try:
        with pa.OSFile(str(path)) as f:  # a local file opened by name: never taken for a URI
            pf = pq.ParquetFile(f, pre_buffer=False)
            have = set(pf.schema_arrow.names)
            t = pf.read(columns=[c for c in cols if c in have], use_threads=False)
    except (pa.ArrowException, OSError, ValueError, TypeError) as e:
        raise EpisodeError(f"{where}: cannot read the parquet file ({type(e).__name__}: {e}); re-download or "
                           "re-convert the dataset") from None
    missing = [c for c in cols if c not in have and c != "task_index"]
    if missing:
        raise EpisodeError(f"{where} has no columns {missing}, which meta/info.json lists as features; re-convert it")
    return t if _sorted(t) else t.sort_by([("episode_index", "ascending"), ("frame_index", "ascending")])


def _sorted(t) -> bool:  # noqa: ANN001 (pyarrow.Table)
    """Whether the rows are in (episode_index, frame_index) order already (integer columns without nulls)."""
    import pyarrow as pa

    e, f = t.column("episode_index"), t.column("frame_index")
    if not (pa.types.is_integer(e.type) and pa.types.is_integer(f.type)) or e.null_count or f.null_count:
        return False
    e, f = e.to_numpy(), f.to_numpy()
    return bool((e[1:] >= e[:-1]).all() and ((e[1:] > e[:-1]) | (f[1:] > f[:-1])).all())


def index_lerobot(src: str | os.PathLike, out: str | os.PathLike, *, tolerance_s: float = lr.DEFAULT_TOLERANCE_S,
                  shard_size: int = SHARD_SIZE, val_fraction: float | None = None,
                  val_episodes: tuple[str, ...] | None = None, seed: int = 0,
                  overwrite: bool = False) -> ReferenceResult:
    """Index the LeRobot dataset ``src`` (v2.x or v3.0) in place into the folder ``out``; see the module docstring.

    Args:
        src: the dataset root (the folder holding ``meta/``, ``data/`` and ``videos/``).
        out: the index folder; when it lies inside ``src`` the index records how many folders up ``src`` is, and
            opening it needs no ``source_root``.
        tolerance_s: LeRobot's timestamp tolerance.
        shard_size: virtual bytes per shard (cut at episode ends).
        val_fraction, val_episodes, seed: splits, as ``write`` assigns them.
        overwrite: replace an index already in ``out``.
    """
    t0 = time.perf_counter()
    reader = lr.LeRobotReader(src, tolerance_s=tolerance_s)
    root, out = reader.root, Path(out)
    if not reader.video_keys:
        raise EpisodeError(f"{root}: no video features to reference (an index in place needs one beside its image "
                           "features); use --codec copy, or --codec jpeg")
    check_out(out, overwrite)
    ids = reader.episode_ids()
    splits = assign_splits(ids, val_fraction=val_fraction, val_episodes=val_episodes, seed=seed)
    last_use: dict[str, int] = {}
    for i, ep in sorted(reader.episodes.items()):
        for rel, _, _ in ep.videos.values():
            last_use[rel] = i
        last_use[ep.data_file] = i
    build = Builder(root, shard_size)
    try:
        _index(reader, ids, splits, last_use, build)
        shards, frames, written = build.finish(out, {
            "format": "lerobot", "codec": "reference", "shard_size": shard_size, "tolerance_s": reader.tolerance_s,
            **({"val_fraction": val_fraction} if val_fraction is not None else {}), "seed": seed})
    finally:
        build.close()
    return ReferenceResult(out, len(ids), frames, shards, time.perf_counter() - t0, build.source_bytes, written)


def _index(reader: lr.LeRobotReader, ids: list[str], splits: dict, last_use: dict[str, int], build: Builder) -> None:
    """Add every episode to ``build``, in order: each data file read once, each mp4 read at its first use."""
    root = reader.root
    table, table_of, values = None, None, {}
    for eid, (i, ep) in zip(ids, sorted(reader.episodes.items())):
        where = f"episode {eid!r}"
        if table_of != ep.data_file:
            fw = f"{where}: {root / ep.data_file}"
            table, table_of = _tables(reader, ep.data_file, fw), ep.data_file
            episode_of = _episode_index(table, fw)
            images = _parquet_images(reader, build, ep.data_file, fw)
            values = {reader.names[k]: (k, lr.column(table.column(k), reader.shapes[k], f"{fw} feature {k!r}"))
                      for k in reader.array_keys}
        lo, hi = np.searchsorted(episode_of, [i, i + 1]).tolist()
        if hi - lo != ep.length:
            raise EpisodeError(f"{where}: {root / ep.data_file} holds {hi - lo} rows of episode {i}, meta/episodes "
                               f"says {ep.length}; the dataset is inconsistent, re-download or re-convert it")
        rows = table.slice(lo, hi - lo)
        times = lr.timestamps(rows.column("timestamp"), f"{where}: {root / ep.data_file}")
        lr.check_frame_index(rows.column("frame_index"), f"{where}: {root / ep.data_file}")
        n = len(times)
        cams = []
        for key in reader.video_keys:
            rel, start, end = ep.videos[key]
            cw = f"{where} camera {key!r} ({root / rel})"
            if end is not None and n and start + times.max() >= end - 0.5 / reader.fps:
                raise EpisodeError(f"{cw}: the last row's timestamp lies past the episode's video span; fix "
                                   "meta/episodes")
            v = build.video(rel, cw)
            cams.append(Camera(reader.names[key], key, v, *_match(v, start, end, times, reader.fps,
                                                                  reader.tolerance_s, cw)))
        cams += _image_cameras(reader, build, images, lo, hi, where)
        tasks = ep.tasks or reader.tasks_of(rows, eid)
        build.add(safe_episode_id(eid), n, cams, {k: (src, v[lo:hi]) for k, (src, v) in values.items()},
                  fps=reader.fps, prompt="; ".join(tasks), split=splits[eid] or "train", extra=reader.extra)
        for rel, _, _ in ep.videos.values():
            if last_use[rel] <= i:
                build.drop(rel)


def _episode_index(table, where: str) -> np.ndarray:  # noqa: ANN001 (pyarrow.Table)
    """The sorted table's episode_index column, to find each episode's rows by bisection."""
    import pyarrow as pa

    col = table.column("episode_index")
    if not pa.types.is_integer(col.type) or col.null_count:
        raise EpisodeError(f"{where}: episode_index is {col.type} with {col.null_count} nulls; it must hold "
                           "integers, re-convert the dataset")
    return col.to_numpy()


def _parquet_images(reader: lr.LeRobotReader, build: Builder, rel: str, where: str) -> ParquetImages | None:
    """The image features' cells of the data file ``rel`` (None without image features)."""
    if not reader.image_keys:
        return None
    number, data = build.plain(rel, where)
    return ParquetImages(number, data, reader.root / rel, reader.image_keys, where)


def _image_cameras(reader: lr.LeRobotReader, build: Builder, images: ParquetImages | None, lo: int, hi: int,
                   where: str) -> list[Camera]:
    """An episode's image cameras: rows ``lo:hi`` of its data file."""
    if images is None:
        return []
    return [Camera(reader.names[key], key, images.camera(key, lo, hi, build.images, build.real,
                                                         f"{where} image feature {key!r}"), 0, hi - lo, 0)
            for key in reader.image_keys]


def summary(res: ReferenceResult) -> str:
    return (f"indexed {res.episodes} episodes, {res.frames} frames in place in {res.seconds:.2f}s into {res.out} "
            f"({res.written_bytes:,} bytes, {100 * res.written_bytes / max(res.source_bytes, 1):.2f}% of the "
            f"{res.source_bytes:,} bytes of video referenced; {res.shards} virtual shards)")


__all__ = ["ReferenceResult", "index_lerobot", "summary"]
