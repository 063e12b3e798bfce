"""Build a ``--codec reference`` index (`episodepipes.codec.reference`) from episodes whose cameras are packets of
source video files: the layout, CRC32s and sha256s the copy import would write, the pieces, the literal bytes, the
statistics, then the index (last). The formats (`lerobot_ref`, `raw_ref`) say which packets make each episode.

Each source file's packets (timestamps, byte positions, keyframes) are read from its mp4 sample tables, or demuxed
where the file is not a plain mp4 (never decoded), and its bytes are read once, for the
records' CRC32s, the shards' sha256 and its stamp (size, CRC32 of its first and last 64 KiB). The statistics are
made once per run of same-split episodes (they merge exactly), and every file is written in one batch, fsynced
together, ``index.json`` renamed last.
"""

from __future__ import annotations

import hashlib
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from episodepipes import safefile
from episodepipes.codec import reference as ref
from episodepipes.codec import reference_blocks
from episodepipes.codec import reference_frames as frames_file
from episodepipes.codec import reference_pieces as pieces_file
from episodepipes.codec.image_pieces import ImageFiles, ImageFrames, placeholder, remap, renumber
from episodepipes.codec.mp4tables import Mp4Error, Tables, read_tables
from episodepipes.codec.reference_layout import CameraPackets, layout
from episodepipes.codec.stream import DECODERS, DEMUXERS
from episodepipes.format import COLUMNS, INDEX_NAME, TAR_END, shard_name
from episodepipes.index import v2 as indexv2
from episodepipes.index.referenced import IMAGES_NAME, LITERAL_BLOCKS, LITERAL_NAME, PIECES_NAME, ROWS_NAME
from episodepipes.index.v2 import REFERENCE_FRAMES
from episodepipes.normstats import sidefile as statsfile
from episodepipes.normstats.fields import StatsFields, episode_part
from episodepipes.normstats.sidefile import NAME as STATS_NAME
from episodepipes.sharding.episode import EpisodeError
from episodepipes.sharding.formats import lerobot_meta as meta

HASH_AHEAD = 4  # episodes laid out ahead of their sha256 (their bytes held meanwhile)
STATS_ROWS = 1 << 16  # steps of same-split episodes whose statistics are made in one pass
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




def _demux(path: Path, number: int, where: str) -> Video:
    """Every packet of ``path``'s first video stream (never decoded), and its bytes: read from an mp4's sample
    tables (`codec.mp4tables`), demuxed packet by packet where the tables are not the plain kind."""
    fmt = DEMUXERS.get(path.suffix.lower())  # the suffix's demuxer, never the bytes'
    if fmt is None:
        raise EpisodeError(f"{where}: a {path.suffix or 'suffix-less'} file is not a video ({', '.join(DEMUXERS)})")
    data = memoryview(path.read_bytes())
    tables = None
    if fmt == "mov":
        try:
            tables = read_tables(data)
        except Mp4Error as e:
            raise EpisodeError(f"{where}: its mp4 boxes are damaged ({e}); re-download it") from None
    if tables is None:
        tables = _packets(path, fmt, data, where)
    if tables.codec not in DECODERS:
        raise EpisodeError(f"{where}: its video is {tables.codec}, which --codec reference does not take "
                           f"({sorted(DECODERS)}); re-encode it")
    t, k, p, z = tables.times, tables.keys, tables.pos, tables.size
    if not len(t):
        raise EpisodeError(f"{where}: its video stream has no packets")
    if np.any(np.diff(t) <= 0):
        raise EpisodeError(f"{where}: its video reorders frames (B-frames or open GOPs), which --codec reference does "
                           "not take; re-encode it with --codec av1")
    if (p + z > len(data)).any():
        raise EpisodeError(f"{where}: a packet lies past the file's end; re-download it")
    rate = tables.rate
    half = 0.5 / rate if rate else (float(np.median(np.diff(t))) / 2 if len(t) > 1 else 0.5)
    key_of = np.maximum.accumulate(np.where(k, np.arange(len(k)), -1))
    return Video(number, t, p, z, key_of, tables.codec, tables.extradata, tables.height, tables.width, half, data)


def _packets(path: Path, fmt: str, data: memoryview, where: str) -> Tables:
    """The packets as FFmpeg's demuxer gives them, one by one (containers other than the plain mp4)."""
    import av

    times, pos, size, keys = [], [], [], []
    try:
        with open(path, "rb") as f, av.open(f, format=fmt) as c:
            if not c.streams.video:
                raise EpisodeError(f"{where}: no video stream")
            s = c.streams.video[0]
            cc = s.codec_context
            tb, rate = float(s.time_base), s.average_rate
            setup = (cc.codec.canonical_name, bytes(cc.extradata or b""), cc.height, cc.width)
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
    return Tables(np.asarray(times, np.float64), np.asarray(pos, np.int64), np.asarray(size, np.int64),
                  np.asarray(keys, bool), *setup, float(rate) if rate else 0.0)


class Camera(NamedTuple):
    """One camera of an episode: its index name, its source name, its file, and which packets: from ``first``,
    ``count`` of them, the first ``lead`` kept only for the GOP of the episode's first frame."""

    name: str
    source: str
    video: Video | ImageFrames  # an image camera: its frames' pieces (`reference_images`)
    first: int
    count: int
    lead: int


class Builder:
    """The index of episodes added in order; `finish` writes it. ``root``: the source root (file names are relative
    to it, and must resolve inside it)."""

    def __init__(self, root: Path, shard_size: int = SHARD_SIZE) -> None:
        self.root, self.real, self.shard_size = Path(root), Path(root).resolve(), shard_size
        self.files: list[ref.FileInfo] = []
        self.images = ImageFiles()  # one image file a frame: a binary table, not the index's JSON
        self._videos: dict[str, Video] = {}
        self._numbers: dict[str, int] = {}
        self.pieces, self.stats = ref.Pieces(), StatsFields()
        self.shards: list[dict] = []
        self.entries: list[dict] = []
        self._sha, self._pos, self._samples = hashlib.sha256(), 0, 0
        # the shard's sha256 runs on one thread, in order, beside the layout: one call an episode, without the GIL
        # (the records' CRC32s stay on this thread: thousands of short calls, which would fight it for the GIL)
        self._hasher = ThreadPoolExecutor(1, thread_name_prefix="reference-hash")
        self._hashing: deque[Future] = deque()
        self._run: list[tuple[str, str, dict[str, np.ndarray]]] = []  # (split, id, arrays) awaiting statistics
        self._run_rows = 0

    @property
    def source_bytes(self) -> int:
        return sum(f.bytes for f in self.files) + self.images.bytes

    def plain(self, rel: str, where: str) -> tuple[int, memoryview]:
        """(number, bytes) of the source file ``rel`` read as it is (a parquet file whose pages hold images)."""
        path = meta.regular_file(meta.inside(self.real, rel, where, EpisodeError), where, EpisodeError)
        try:
            ref.check_file(rel)
        except ValueError as e:
            raise EpisodeError(f"{where}: {e}; rename it") from None
        data = memoryview(path.read_bytes())
        number = self._numbers.get(rel)
        if number is None:
            number = self._numbers[rel] = len(self.files)
            self.files.append(ref.FileInfo(rel, len(data), *ref.stamp(lambda o, k: data[o:o + k], len(data))))
        elif self.files[number].bytes != len(data):
            raise EpisodeError(f"{where}: {rel} changed while it was indexed; index it again")
        return number, data

    def video(self, rel: str, where: str) -> Video:
        """The demuxed file ``rel`` (relative to the root), demuxed at its first use and kept until `drop`."""
        v = self._videos.get(rel)
        if v is None:
            if rel in self._numbers:
                raise EpisodeError(f"{where}: {rel} was used before another file; its episodes must be in order")
            path = meta.regular_file(meta.inside(self.real, rel, where, EpisodeError), where, EpisodeError)
            try:
                ref.check_file(rel)
            except ValueError as e:
                raise EpisodeError(f"{where}: {e}; rename it") from None
            self._numbers[rel] = len(self.files)
            v = self._videos[rel] = _demux(path, len(self.files), where)
            data = v.data
            self.files.append(ref.FileInfo(rel, len(data), *ref.stamp(lambda o, k: data[o:o + k], len(data))))
        return v

    def drop(self, rel: str) -> None:
        """Forget a file's packets and bytes (no later episode uses it)."""
        self._videos.pop(rel, None)

    def add(self, eid: str, n: int, cameras: list[Camera], arrays: dict[str, tuple[str, np.ndarray]], *,
            fps: float, prompt: str, split: str, extra: dict) -> None:
        """Episode ``eid`` (a safe id) of ``n`` frames: its cameras' packets and its arrays (name -> (source name,
        (n, ...) values)), laid out as the copy import lays it out."""
        cams = sorted(cameras, key=lambda c: c.name)
        if all(isinstance(c.video, ImageFrames) for c in cams):
            raise EpisodeError(f"episode {eid!r}: its cameras are all images; an index in place needs a video camera "
                               "beside them (its packed layout); use --codec copy for this dataset")
        backs = np.zeros((n, len(cams)), np.int64)
        packets, cam_meta = [], {}
        for c, cam in enumerate(cams):
            if isinstance(cam.video, ImageFrames):
                if len(cam.video.offsets) != n:
                    raise EpisodeError(f"episode {eid!r} camera {cam.source!r}: {len(cam.video.offsets)} images, {n} "
                                       "rows or steps; trim them to match")
                packets.append(cam.video.packets(c))
                cam_meta[cam.name] = cam.video.meta(cam.source)
                continue
            v, k0, count, lead = cam.video, cam.first, cam.count, cam.lead
            if count - lead != n:
                raise EpisodeError(f"episode {eid!r} camera {cam.source!r}: {count - lead} frames, {n} rows or steps; "
                                   "trim them to match")
            packets.append(CameraPackets(v.number, v.pos[k0:k0 + count], v.size[k0:k0 + count], v.data, lead))
            key_rel = v.key_of[k0:k0 + count] - k0
            backs[:, c] = np.arange(n) - np.maximum(key_rel[lead:] - lead, 0)
            idx = np.arange(lead, count)
            cam_meta[cam.name] = {"height": v.height, "width": v.width, "source": cam.source,
                                  "source_height": v.height, "source_width": v.width, "codec": v.codec,
                                  "gop": max(int((idx - key_rel[idx]).max()) + 1, 1),
                                  **({"extradata": v.extradata.hex()} if v.extradata else {})}
        names = sorted(arrays)
        for k in names:
            if len(arrays[k][1]) != n:
                raise EpisodeError(f"episode {eid!r}: array {arrays[k][0]!r} has {len(arrays[k][1])} steps, the "
                                   f"cameras {n} frames; trim them to match")
        flat = [np.ascontiguousarray(arrays[k][1]).reshape(n, -1).view(np.uint8) for k in names]
        rows = np.hstack(flat) if flat else np.zeros((n, 0), np.uint8)
        parts = layout(eid.encode(), packets, backs, rows, [f.shape[1] for f in flat])
        parts = remap(parts, {placeholder(c): cam.video for c, cam in enumerate(cams)
                              if isinstance(cam.video, ImageFrames)})
        start = self._pos
        offsets = (start + np.cumsum(parts.spans) - np.asarray(parts.spans)).tolist()
        self.pieces.extend(start, parts)
        crcs = parts.crcs()
        self._hashing.append(self._hasher.submit(self._sha.update, parts.blob))
        while len(self._hashing) > HASH_AHEAD:
            self._hashing.popleft().result()
        self._pos += len(parts.blob)
        if self._pos != start + sum(parts.spans):
            raise AssertionError(f"episode {eid!r}: its parts hold {self._pos - start} bytes, its spans "
                                 f"{sum(parts.spans)}")
        self.entries.append({"id": eid, "split": split, "length": n, "fps": float(fps), "prompt": prompt,
                             "cameras": cam_meta,
                             "arrays": {k: {"dtype": arrays[k][1].dtype.str, "shape": list(arrays[k][1].shape[1:]),
                                            "source": arrays[k][0]} for k in names},
                             **extra,
                             "segments": [{"shard": len(self.shards), "first": 0, "count": n, "offsets": offsets,
                                           "end": self._pos, "crc32": crcs, "heads": parts.heads,
                                           "sizes": parts.sizes, "keys": parts.keys}]})
        self._stats_add(split, eid, {k: arrays[k][1] for k in names})
        self._samples += n
        if self._pos >= self.shard_size:
            self._end_shard()

    def _stats_add(self, split: str, eid: str, arrays: dict[str, np.ndarray]) -> None:
        """Queue an episode's arrays for `_stats_flush`, which runs once per run of same-split, same-schema ones."""
        sig = {k: (v.dtype, v.shape[1:]) for k, v in arrays.items()}
        if self._run and (self._run[-1][0] != split or self._run_rows + len(next(iter(arrays.values()), ())) >
                          STATS_ROWS or {k: (v.dtype, v.shape[1:]) for k, v in self._run[-1][2].items()} != sig):
            self._stats_flush()
        self._run.append((split, eid, arrays))
        self._run_rows += len(next(iter(arrays.values()), ()))

    def _stats_flush(self) -> None:
        """Fold the queued episodes' statistics: one pass over their rows together (the statistics merge exactly,
        so this is the per-episode fold, bit for bit); a key that fails on the run (NaN, non-numeric) is folded
        episode by episode, so its reason names the first episode it fails on, as the copy import's does."""
        run, self._run, self._run_rows = self._run, [], 0
        if not run:
            return
        split = run[0][0]
        if len(run) == 1:
            self.stats.add(split, *episode_part(run[0][1], run[0][2]))
            return
        whole = {k: np.concatenate([a[k] for _, _, a in run]) for k in run[0][2]}
        stats, failed = episode_part(run[0][1], whole)
        self.stats.add(split, stats, {})
        for _, eid, arrays in run:
            keys = [k for k in failed if (split, k) not in self.stats.missing]
            if not keys:
                break
            self.stats.add(split, *episode_part(eid, {k: arrays[k] for k in keys}))

    def _drain(self) -> None:
        while self._hashing:
            self._hashing.popleft().result()

    def close(self) -> None:
        """Stop the hashing thread (after `finish`, or when indexing failed)."""
        self._hasher.shutdown(wait=True, cancel_futures=True)

    def _end_shard(self) -> None:
        self._drain()
        self.pieces.end_shard(self._pos)
        self._sha.update(TAR_END)
        self.shards.append({"name": shard_name(len(self.shards)), "bytes": self._pos + len(TAR_END),
                            "sha256": self._sha.hexdigest(), "samples": self._samples})
        self._sha, self._pos, self._samples = hashlib.sha256(), 0, 0

    def finish(self, out: Path, options: dict) -> tuple[int, int, int]:
        """Write the pieces, the literal bytes, the rows and the statistics, then the index (last, atomically); returns
        (shards, frames, bytes written)."""
        if self._samples:
            self._end_shard()
        self._drain()
        self._stats_flush()
        if not self.entries:
            raise EpisodeError(f"{self.root}: no episodes to index")
        out = Path(out)
        if not out.exists():
            safefile.make_dir(out, parents=True)
        cols = self.pieces.columns()
        cols["file"] = renumber(cols["file"], len(self.files)).astype("<i4")  # image files after the listed ones
        blobs = {PIECES_NAME: pieces_file.encode(cols, [s["bytes"] for s in self.shards])}
        blobs[LITERAL_BLOCKS] = reference_blocks.encode(self.pieces.literal)
        if self.pieces.width:
            blobs[ROWS_NAME] = self.pieces.rows_file()
        images = self.images.encode() if len(self.images) else None
        if images is not None:
            blobs[IMAGES_NAME] = images[0]
        stats = self.stats.encode()
        extra = statsfile.descriptor(stats)
        reference = {"files": [list(f) for f in self.files],
                     "hashes": {},  # below, with the frames file
                     "literal": len(self.pieces.literal), "pieces": len(self.pieces.start),
                     **({"rows": self.pieces.width} if self.pieces.width else {}),
                     **({"images": images[1]} if images is not None else {})}
        inside = _depth(out, self.real)
        if inside is not None:
            reference["up"] = inside
        data, cols = indexv2.build(self.shards, self.entries, options, {**extra, "reference": reference},
                                   layout="packed")
        per_frame = {k: cols.pop(k) for k in frames_file.NAMES}  # in a file of their own, deflated
        blobs[REFERENCE_FRAMES] = frames_file.encode(per_frame)
        reference["hashes"] = {k: hashlib.sha256(v).hexdigest() for k, v in sorted(blobs.items())}
        # one batch: the pieces, literal bytes and statistics are durable before index.json names them
        indexv2.write(out, data, cols,
                      beside=[(out / STATS_NAME, stats), *((out / k, v) for k, v in sorted(blobs.items()))])
        for stale in (LITERAL_NAME, *(COLUMNS[k][0] for k in frames_file.NAMES)):  # an older index's, replaced
            (out / stale).unlink(missing_ok=True)
        written = sum(p.stat().st_size for p in out.iterdir() if p.is_file() and (
            p.name.startswith(("index.", "reference.")) or p.name == INDEX_NAME))
        return len(self.shards), sum(e["length"] for e in self.entries), written


def _depth(out: Path, real: Path) -> int | None:
    """How many folders up from ``out`` the source root is, when ``out`` lies inside it."""
    try:
        rel = out.resolve().relative_to(real)
    except ValueError:
        return None
    return len(rel.parts) if 0 < len(rel.parts) <= ref.MAX_DEPTH else None


def check_out(out: Path, overwrite: bool) -> None:
    """Refuse an index already in ``out`` unless ``overwrite``."""
    if (Path(out) / INDEX_NAME).exists() and not overwrite:
        raise FileExistsError(f"{Path(out) / INDEX_NAME} exists; pass --overwrite to replace it")
