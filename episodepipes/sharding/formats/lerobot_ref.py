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

import hashlib
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from episodepipes import safefile
from episodepipes.codec import reference as ref
from episodepipes.codec.copy import MAX_GOP
from episodepipes.codec.stream import DECODERS, DEMUXERS
from episodepipes.format import INDEX_NAME, npy_bytes, safe_episode_id, shard_name
from episodepipes.index.referenced import LITERAL_NAME, PIECE_FILES
from episodepipes.normstats.fields import StatsFields, episode_part
from episodepipes.normstats.sidefile import NAME as STATS_NAME
from episodepipes.sharding.episode import EpisodeError
from episodepipes.sharding.formats import lerobot as lr
from episodepipes.sharding.formats import lerobot_meta as meta
from episodepipes.sharding.write.plan import assign_splits
from episodepipes.sharding.write.writer import write_index

log = logging.getLogger(__name__)

SHARD_SIZE = 1 << 30  # virtual bytes per shard: shards cost nothing on disk, and fewer keep index.json small


@dataclass
class Video:
    """One source mp4, demuxed: per packet its time (s), byte position, size and keyframe; its decoder setup."""

    number: int
    times: np.ndarray
    pos: np.ndarray
    size: np.ndarray
    key_of: np.ndarray
    codec: str
    extradata: bytes
    height: int
    width: int
    half: float
    data: memoryview


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


def _demux(path: Path, number: int, where: str) -> Video:
    """Every packet of ``path``'s first video stream (never decoded), and its bytes."""
    import av

    lr.video_demuxer(path, where)  # the suffix's demuxer, never the bytes'
    fmt = DEMUXERS[path.suffix.lower()]
    data = memoryview(path.read_bytes())
    times, pos, size, keys = [], [], [], []
    try:
        with open(path, "rb") as f, av.open(f, format=fmt) as c:
            if not c.streams.video:
                raise EpisodeError(f"{where}: no video stream")
            s = c.streams.video[0]
            cc = s.codec_context
            codec = cc.codec.canonical_name
            if codec not in DECODERS:
                raise EpisodeError(f"{where}: its video is {codec}, which --codec reference does not take "
                                   f"({sorted(DECODERS)}); re-encode it")
            tb, rate = float(s.time_base), s.average_rate
            extradata, h, w = bytes(cc.extradata or b""), cc.height, cc.width
            for p in c.demux(s):
                if p.size and p.pts is not None:
                    if p.pos is None or p.pos < 0:
                        raise EpisodeError(f"{where}: a packet has no byte position in the file; re-encode it")
                    if not times and bytes(p) != bytes(data[p.pos:p.pos + p.size]):
                        raise EpisodeError(f"{where}: the demuxed packets are not the file's bytes; use --codec copy")
                    times.append(p.pts * tb)
                    pos.append(p.pos)
                    size.append(p.size)
                    keys.append(p.is_keyframe)
    except av.FFmpegError as e:
        raise EpisodeError(f"{where}: cannot read the video ({type(e).__name__}: {e}); re-download it") from e
    t, k = np.asarray(times, np.float64), np.asarray(keys, bool)
    p, z = np.asarray(pos, np.int64), np.asarray(size, np.int64)
    if not len(t):
        raise EpisodeError(f"{where}: its video stream has no packets")
    if np.any(np.diff(t) <= 0):
        raise EpisodeError(f"{where}: its video reorders frames (B-frames or open GOPs), which --codec reference does "
                           "not take; re-encode it with --codec av1")
    if (p + z > len(data)).any():
        raise EpisodeError(f"{where}: a packet lies past the file's end; re-download it")
    half = 0.5 / float(rate) if rate else (float(np.median(np.diff(t))) / 2 if len(t) > 1 else 0.5)
    key_of = np.maximum.accumulate(np.where(k, np.arange(len(k)), -1))
    return Video(number, t, p, z, key_of, codec, extradata, h, w, half, data)


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
    """A data file's rows, sorted by episode and frame, read once."""
    path = meta.regular_file(meta.inside(reader.root.resolve(), rel, where, EpisodeError), where, EpisodeError)
    cols = ["timestamp", "frame_index", "episode_index", "task_index", *reader.array_keys]
    have = set(lr.parquet(path, where, EpisodeError, schema=True).names)
    missing = [c for c in cols if c not in have and c != "task_index"]
    if missing:
        raise EpisodeError(f"{where} has no columns {missing}, which meta/info.json lists as features; re-convert it")
    t = lr.parquet(path, where, EpisodeError, columns=[c for c in cols if c in have])
    return t.sort_by([("episode_index", "ascending"), ("frame_index", "ascending")])


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
    if reader.image_keys:
        raise EpisodeError(f"{root}: image features {reader.image_keys} are stored in the parquet files, not as files "
                           "to point at; use --codec copy for this dataset")
    if not reader.video_keys:
        raise EpisodeError(f"{root}: no video features to reference; use --codec jpeg")
    if (out / INDEX_NAME).exists() and not overwrite:
        raise FileExistsError(f"{out / INDEX_NAME} exists; pass --overwrite to replace it")
    real = root.resolve()
    ids = reader.episode_ids()
    splits = assign_splits(ids, val_fraction=val_fraction, val_episodes=val_episodes, seed=seed)
    cams = sorted(reader.video_keys, key=lambda k: reader.names[k])
    arrays = sorted(reader.array_keys, key=lambda k: reader.names[k])
    last_use: dict[str, int] = {}
    for i, ep in sorted(reader.episodes.items()):
        for rel, _, _ in ep.videos.values():
            last_use[rel] = i
        last_use[ep.data_file] = i
    videos: dict[str, Video] = {}
    numbers: dict[str, int] = {}
    files: list[ref.FileInfo] = []
    pieces, stats = ref.Pieces(), StatsFields()
    shards: list[dict] = []
    entries: list[dict] = []
    sha, pos, samples, table, table_of = hashlib.sha256(), 0, 0, None, None
    for eid, (i, ep) in zip(ids, sorted(reader.episodes.items())):
        where = f"episode {eid!r}"
        if table_of != ep.data_file:
            table, table_of = _tables(reader, ep.data_file, f"{where}: {root / ep.data_file}"), ep.data_file
        rows = _episode_rows(table, i, ep.length, f"{where}: {root / ep.data_file}")
        times = lr.timestamps(rows.column("timestamp"), f"{where}: {root / ep.data_file}")
        lr.check_frame_index(rows.column("frame_index"), f"{where}: {root / ep.data_file}")
        n = len(times)
        per_cam, backs, cam_meta = [], np.zeros((n, len(cams)), np.int64), {}
        for c, key in enumerate(cams):
            rel, start, end = ep.videos[key]
            cw = f"{where} camera {key!r} ({root / rel})"
            if end is not None and n and start + times.max() >= end - 0.5 / reader.fps:
                raise EpisodeError(f"{cw}: the last row's timestamp lies past the episode's video span; fix "
                                   "meta/episodes")
            v = videos.get(rel)
            if v is None:
                path = meta.regular_file(meta.inside(real, rel, cw, EpisodeError), cw, EpisodeError)
                ref.check_file(rel)
                numbers[rel] = len(files)
                v = videos[rel] = _demux(path, len(files), cw)
                data = v.data
                files.append(ref.FileInfo(rel, len(data), *ref.stamp(lambda o, k, d=data: d[o:o + k], len(data))))
            k0, count, lead = _match(v, start, end, times, reader.fps, reader.tolerance_s, cw)
            refs = [ref.Ref(v.number, int(a), int(z), v.data[a:a + z])
                    for a, z in zip(v.pos[k0:k0 + count].tolist(), v.size[k0:k0 + count].tolist())]
            key_rel = v.key_of[k0:k0 + count] - k0
            backs[:, c] = np.arange(n) - np.maximum(key_rel[lead:] - lead, 0)
            per_cam.append([refs[:lead + 1], *([r] for r in refs[lead + 1:])])
            idx = np.arange(lead, count)
            name = reader.names[key]
            cam_meta[name] = {"height": v.height, "width": v.width, "source": key, "source_height": v.height,
                              "source_width": v.width, "codec": v.codec,
                              "gop": max(int((idx - key_rel[idx]).max()) + 1, 1),
                              **({"extradata": v.extradata.hex()} if v.extradata else {})}
        values = {reader.names[k]: lr.column(rows.column(k), reader.shapes[k], f"{where} feature {k!r}")
                  for k in arrays}
        flat = [np.ascontiguousarray(values[reader.names[k]]).reshape(n, -1).view(np.uint8) for k in arrays]
        row_bytes = np.hstack(flat) if flat else np.zeros((n, 0), np.uint8)
        row_sizes = [f.shape[1] for f in flat]
        splits_at = np.cumsum([0, *row_sizes])
        rows_t = [[r[a:b] for a, b in zip(splits_at[:-1], splits_at[1:])] for r in (bytes(x) for x in row_bytes)]
        safe = safe_episode_id(eid)
        parts = ref.layout(safe.encode(), per_cam, backs, rows_t)
        offsets, p = [], pos
        for s in parts.spans:
            offsets.append(p)
            p += s
        for part in parts.parts:
            pieces.add(pos, part)
            sha.update(part.data if isinstance(part, ref.Ref) else part)
            pos += part.size if isinstance(part, ref.Ref) else len(part)
        if pos != p:
            raise AssertionError(f"{where}: the parts hold {pos - offsets[0]} bytes, the spans {p - offsets[0]}")
        split = splits[eid] or "train"
        tasks = ep.tasks or reader.tasks_of(rows, eid)
        entries.append({"id": safe, "split": split, "length": n, "fps": float(reader.fps), "prompt": "; ".join(tasks),
                        "cameras": cam_meta,
                        "arrays": {reader.names[k]: {"dtype": values[reader.names[k]].dtype.str,
                                                     "shape": list(values[reader.names[k]].shape[1:]), "source": k}
                                   for k in arrays},
                        **reader.extra,
                        "segments": [{"shard": len(shards), "first": 0, "count": n, "offsets": offsets, "end": pos,
                                      "crc32": parts.crcs, "heads": parts.heads, "sizes": parts.sizes,
                                      "keys": parts.keys}]})
        stats.add(split, *episode_part(safe, values))
        samples += n
        for rel in [r for r, _, _ in ep.videos.values()]:
            if last_use[rel] <= i:
                videos.pop(rel, None)
        if pos >= shard_size:
            pos, samples, sha = _end_shard(pieces, shards, pos, samples, sha)
    if samples:
        _end_shard(pieces, shards, pos, samples, sha)
    written = _write(out, root, real, shards, entries, files, pieces, stats, {
        "format": "lerobot", "codec": "reference", "shard_size": shard_size, "tolerance_s": reader.tolerance_s,
        **({"val_fraction": val_fraction} if val_fraction is not None else {}), "seed": seed})
    frames = sum(e["length"] for e in entries)
    return ReferenceResult(out, len(entries), frames, len(shards), time.perf_counter() - t0,
                           sum(f.bytes for f in files), written)


def _episode_rows(table, index: int, length: int, where: str):  # noqa: ANN001, ANN202 (pyarrow.Table)
    """Episode ``index``'s rows of its data file's sorted table."""
    import pyarrow as pa
    import pyarrow.compute as pc

    try:
        rows = table.filter(pc.equal(table.column("episode_index"), pa.scalar(index, pa.int64())))
    except (pa.ArrowException, TypeError, ValueError) as e:
        raise EpisodeError(f"{where}: cannot select the episode's rows ({type(e).__name__}: {e}); re-convert it") \
            from None
    if rows.num_rows != length:
        raise EpisodeError(f"{where} holds {rows.num_rows} rows of episode {index}, meta/episodes says {length}; the "
                           "dataset is inconsistent, re-download or re-convert it")
    return rows


def _end_shard(pieces: ref.Pieces, shards: list[dict], pos: int, samples: int,
               sha: hashlib._Hash) -> tuple[int, int, hashlib._Hash]:
    from episodepipes.format import TAR_END

    pieces.end_shard(pos)
    sha.update(TAR_END)
    shards.append({"name": shard_name(len(shards)), "bytes": pos + len(TAR_END), "sha256": sha.hexdigest(),
                   "samples": samples})
    return 0, 0, hashlib.sha256()


def _write(out: Path, root: Path, real: Path, shards: list[dict], entries: list[dict], files: list[ref.FileInfo],
           pieces: ref.Pieces, stats: StatsFields, options: dict) -> int:
    """The piece columns, the literal bytes and the statistics, then the index (last, atomically); returns the
    bytes written."""
    if not out.exists():
        safefile.make_dir(out, parents=True)
    blobs = {PIECE_FILES[k]: npy_bytes(v) for k, v in pieces.columns().items()}
    blobs[LITERAL_NAME] = bytes(pieces.literal)
    safefile.write_files([(out / k, v) for k, v in sorted(blobs.items())])
    extra = dict(stats.write(out / STATS_NAME))
    reference = {"files": [list(f) for f in files],
                 "hashes": {k: hashlib.sha256(v).hexdigest() for k, v in sorted(blobs.items())},
                 "literal": len(pieces.literal), "pieces": len(pieces.start)}
    inside = _depth(out, real)
    if inside is not None:
        reference["up"] = inside
    raw = write_index(out, shards, entries, options, extra={**extra, "reference": reference}, layout="packed")
    return len(raw) + sum(len(v) for v in blobs.values()) + sum(
        (out / n).stat().st_size for n in os.listdir(out) if n.startswith("index.") and n != INDEX_NAME)


def _depth(out: Path, real: Path) -> int | None:
    """How many folders up from ``out`` the source root is, when ``out`` lies inside it."""
    try:
        rel = out.resolve().relative_to(real)
    except ValueError:
        return None
    return len(rel.parts) if 0 < len(rel.parts) <= ref.MAX_DEPTH else None


def summary(res: ReferenceResult) -> str:
    return (f"indexed {res.episodes} episodes, {res.frames} frames in place in {res.seconds:.2f}s into {res.out} "
            f"({res.written_bytes:,} bytes, {100 * res.written_bytes / max(res.source_bytes, 1):.2f}% of the "
            f"{res.source_bytes:,} bytes of video referenced; {res.shards} virtual shards)")


__all__ = ["LITERAL_NAME", "PIECE_FILES", "ReferenceResult", "index_lerobot", "summary"]
