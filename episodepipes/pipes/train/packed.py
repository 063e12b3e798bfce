"""`train_pipe` on packed (video-codec) shards: a sample's steps read by byte range, each window's GOPs once.

`TrainReader`'s order, state and resume are untouched; `PackedTrainReader` changes only how a sample's steps are
read. The frames whose records a sample needs are the current step and each camera-window step with the records
back to their key frame (the index's ``key`` column), and each array-window step's own record (no GOP: arrays are
raw rows; an in-place index, `codec.reference`, reads it from its rows file instead, without the record's packets).
Runs of consecutive frames of one shard are one byte range, so a history window reads from its earliest key frame
to its latest step once; every record is checked against the index's CRC32 and parsed into the members a
JPEG frame has (`videoframes.packed_members`). The decode stage is `VideoFrames` (its `DecoderPool` keeps GOPs, so a
window decoded in step order decodes each packet once); `TrainFrames` is its form for mixtures, whose sources may
hold a batch camera as JPEG in one and as packets in another.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from episodepipes.codec.chunk import Record
from episodepipes.codec.pack import MAGIC
from episodepipes.index import Episode, EpisodeIndex
from episodepipes.pipes.frames import JPEG, FrameDecoder, decode_jpeg
from episodepipes.pipes.order.window import damaged_sample, fields_by_step, video_fields, window_sample
from episodepipes.pipes.plan import Item
from episodepipes.pipes.sample import RawSample
from episodepipes.pipes.train.reader import TrainReader
from episodepipes.pipes.videoframes import (
    Gop,
    VideoFrames,
    array_members,
    key_frame,
    packed_members,
    parse_packed,
    video_cameras,
)


def is_packed(index: EpisodeIndex) -> bool:
    return index.meta.get("layout") == "packed"


def check_trainable(index: EpisodeIndex, where: str) -> None:
    """Refuse video cameras in the members layout (each frame a packet member, written before the packed one)."""
    video = sorted(video_cameras(index))
    if video and not is_packed(index):
        raise ValueError(f"cameras {video} of {where} are video packets in the older members layout, which "
                         "train_pipe does not read; re-shard it with this version's write --codec")


def camera_steps(t: int, steps: Mapping[int, set[str]]) -> set[int]:
    """The steps of sample ``t`` (window ``steps``, `fields_by_step`) that read a camera: ``t`` and camera-window
    steps, each of which needs the records from its key frame to itself."""
    return {t} | {s for s, want in steps.items() if any(not f.endswith(".npy") for f in want)}


def needed_frames(index: EpisodeIndex, ep: Episode, t: int, steps: Mapping[int, set[str]],
                  keys: Mapping[int, int] | None = None, *, rows: bool = False) -> tuple[list[int], set[int]]:
    """(every frame whose record the sample reads, in order; the steps read only for their arrays).

    A step with a camera (`camera_steps`) needs the records from its key frame to itself; ``keys`` gives each such
    step's key frame where the caller looked them up already (None: `key_frame` looks each up here). With ``rows``
    (the arrays are read apart from the records, `step_rows`), a step read only for its arrays needs no record.
    """
    cams = camera_steps(t, steps)
    frames = set(cams if rows else steps)
    for s in cams:
        frames.update(range(key_frame(index, ep.id, s) if keys is None else keys[s], s + 1))
    return sorted(frames), set(steps) - cams


def rows_source(index: EpisodeIndex, source: Any) -> Any | None:
    """``source`` where the index keeps the steps' arrays apart from their records (an in-place index with a rows
    file: its source is a `codec.reference.ReferenceSource`, read with ``step_rows``), else None: such steps read
    their records. Decided by the index's checked JSON, never by probing the source."""
    return source if index.referenced and index.meta["reference"].get("rows") is not None else None


def row_record(index: EpisodeIndex, ep: Episode, row: memoryview) -> Record:
    """A `Record` of a step's arrays only (no camera), split from its rows file row as the record holds them."""
    out, at = [], 0
    for _, spec in sorted(ep.arrays.items()):
        n = np.dtype(spec.dtype).itemsize * math.prod(spec.shape)
        out.append(row[at:at + n])
        at += n
    return Record((), (), tuple(out))


def frame_runs(ep: Episode, frames: list[int]) -> list[tuple[int, int, int, list[int]]]:
    """(shard, start, end, frames) per run of consecutive frames in one shard: each run is one byte range."""
    runs: list[tuple[int, int, int, list[int]]] = []
    for f in frames:
        shard, a, b = ep.frame_range(f)
        if runs and runs[-1][0] == shard and runs[-1][3][-1] == f - 1:
            s, start, _, fs = runs.pop()
            runs.append((s, start, b, [*fs, f]))
        else:
            runs.append((shard, a, b, [f]))
    return runs


class PackedTrainReader(TrainReader):
    """`TrainReader` of a packed index (same constructor, order and state): steps read as records, not tar members.

    A window's camera field is its video member (``<camera>.<codec>``) instead of ``.jpg``; the state keeps only
    the windows' extents, so it is the JPEG reader's.
    """

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.windows = video_fields(self.windows, video_cameras(self.index))

    def sample(self, flat: int, got: Mapping[int, bytes] | None = None) -> RawSample:
        """The sample of flat frame ``flat``: its records from ``got`` (frame -> bytes, what a remote root's
        read-ahead fetched, `_fetch_steps`), any other read here by runs of consecutive frames."""
        e, t = self.table.locate(flat)
        ep, ix = self.episodes[e], self.index
        shard_name = ix.shards[ep.frame_range(t)[0]].name  # the episode's segments checked before its keys are used
        steps = fields_by_step(t, ep.length, self.windows)
        rows = rows_source(ix, self.source)
        frames, arrays_only = needed_frames(ix, ep, t, steps, rows=rows is not None)
        got = got or {}
        records: dict[int, Record | None] = {}
        for f in frames:
            if f in got:
                self.stats.add("bytes_read", len(got[f]))
                records[f] = parse_packed(ix, ep.id, f, got[f])
        for shard, start, end, fs in frame_runs(ep, [f for f in frames if f not in got]):
            [data] = self.source.read_ranges(self._names[shard], [(start, end - start)])
            self.stats.add("bytes_read", len(data))
            view = memoryview(data)
            for f in fs:
                _, a, b = ep.frame_range(f)
                records[f] = parse_packed(ix, ep.id, f, view[a - start:b - start])
        read: dict[int, dict[str, bytes]] = {}
        why = next((f"frame {f}'s record does not match its crc32 in the index or is not a record"
                    for f in frames if records[f] is None), None)
        apart = sorted(arrays_only) if rows is not None and why is None else []
        if apart:  # the arrays-only steps' rows, one read of the rows file from the first to the last
            width, first = rows.rows[1], int(self.episodes.firsts[e])
            data = rows.step_rows(first + apart[0], apart[-1] - apart[0] + 1)
            if data is None:
                why = f"the rows of steps {apart[0]}..{apart[-1]} do not match their crc32 in the index"
            else:
                self.stats.add("bytes_read", len(data))
                for s in apart:
                    at = (s - apart[0]) * width
                    records[s] = row_record(ix, ep, data[at:at + width])
        for s in [t, *steps] if why is None else ():
            if s in arrays_only:
                read[s], why = array_members(ix, ep.id, records[s])  # type: ignore[arg-type]
            else:
                read[s], why = packed_members(ix, ep.id, s, records.__getitem__)
            if why is not None:
                break
        self.stats.add("frames_read", len(steps) + 1)
        item = Item(ep.id, t)
        if why is not None:
            return damaged_sample(item, shard_name, ep.length, self.windows, why)
        return window_sample(item, shard_name, ep.length, self.windows, read)

    def _fetch_steps(self, es: list[int], ts: list[int]) -> list[Sequence[int]]:
        """Every frame each sample's records come from (`needed_frames`), so the read-ahead fetches what `sample`
        reads: the key frames of every camera step of the batch looked up together (one round of column-block
        reads on a remote root, not one per frame)."""
        stepss = [fields_by_step(t, self.episodes[e].length, self.windows) for e, t in zip(es, ts)]
        cams = [(e, s) for e, t, steps in zip(es, ts, stepss) for s in sorted(camera_steps(t, steps))]
        firsts = self.episodes.firsts[np.fromiter((e for e, _ in cams), np.int64, len(cams))]
        rows = firsts + np.fromiter((s for _, s in cams), np.int64, len(cams))
        self.index.frame_ranges(rows)  # their segments checked before their keys are used (a remote index: now)
        keys = np.asarray(self.index.tables.columns["key"][rows], np.int64) - firsts
        by_ep: dict[int, dict[int, int]] = {}
        for (e, s), k in zip(cams, keys.tolist()):
            by_ep.setdefault(e, {})[s] = k
        apart = rows_source(self.index, self.source) is not None
        return [needed_frames(self.index, self.episodes[e], t, steps, by_ep[e], rows=apart)[0]
                for e, t, steps in zip(es, ts, stepss)]


class RenamedTrainReader(TrainReader):
    """A JPEG source's `TrainReader` in a mixture whose batch camera is video elsewhere: its ``<camera>.jpg``
    member goes under the video field the mixture's `TrainFrames` reads (`TrainFrames.decode` tells them apart)."""

    renames: dict[str, str] = {}

    def sample(self, flat: int, *args: Any) -> RawSample:
        raw = super().sample(flat, *args)
        if not self.renames:
            return raw
        return replace(raw, members={self.renames.get(f, f): b for f, b in raw.members.items()})


def mixture_reader(index: EpisodeIndex, episodes: Sequence[Episode], keys: Mapping[str, str] | None,
                   video: Mapping[str, tuple[str, int]], **kw: Any) -> TrainReader:
    """A mixture source's reader (``kw`` as `TrainReader`'s): a JPEG source's gives a camera that is video in
    another source (``video``, by batch key) under the video field."""
    if is_packed(index):
        return PackedTrainReader(index, episodes, **kw)
    reader = RenamedTrainReader(index, episodes, **kw)
    mine = video_cameras(index)
    reader.renames = {f"{a}.jpg": f"{a}.{video[b][0]}" for a in reader.episodes[0].cameras
                      if a not in mine and (b := a if keys is None else keys.get(a, "")) in video}
    return reader


def reader_class(index: EpisodeIndex) -> type[TrainReader]:
    """The reader of an index's layout (a mixture's sources: `mixture_reader`)."""
    return PackedTrainReader if is_packed(index) else TrainReader


@dataclass(frozen=True)
class TrainFrames:
    """`FrameDecoder` of a mixture's batch cameras: ``cameras`` (batch camera -> (codec, gop)) are video in some
    source; a member of one that is not a packed GOP (no EPK1 magic: a JPEG starts ``FF D8``) is a JPEG frame."""

    cameras: dict[str, tuple[str, int]] = field(default_factory=dict)

    def field(self, camera: str) -> str:
        return VideoFrames(self.cameras).field(camera)

    def decode(self, camera: str, data: bytes, *, src: tuple[int, int], size: tuple[int, int] | None = None,
               out: np.ndarray | None = None) -> np.ndarray | None:
        if camera not in self.cameras or not isinstance(data, Gop) and bytes(data[:len(MAGIC)]) != MAGIC:
            return decode_jpeg(data, src=src, size=size, out=out)
        return VideoFrames(self.cameras).decode(camera, data, src=src, size=size, out=out)


def mixture_frames(indexes: list[EpisodeIndex], keys: list[Mapping[str, str] | None],
                   names: list[str]) -> dict[str, tuple[str, int]]:
    """Batch camera -> (codec, gop) of every camera that is video in some source; two codecs are refused."""
    out: dict[str, tuple[str, int]] = {}
    for idx, k, name in zip(indexes, keys, names):
        for c, (codec, gop) in video_cameras(idx).items():
            if k is not None and c not in k:
                continue
            b = c if k is None else k[c]
            got = out.setdefault(b, (codec, gop))
            if got[0] != codec:
                raise ValueError(f"batch camera {b!r} is {got[0]} in one source and {codec} in source {name!r}; "
                                 "re-shard one of them with the other's --codec")
            out[b] = (codec, max(got[1], gop))
    return out


def frames_of(index: EpisodeIndex) -> FrameDecoder:
    """The `FrameDecoder` of one source's cameras: `VideoFrames` where any is video, else JPEG."""
    video = video_cameras(index)
    return VideoFrames(video) if video else JPEG
