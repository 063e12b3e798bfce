"""Video-codec cameras (h264/AV1): the reader attaches each frame's GOP, and `VideoFrames` decodes it.

In the packed layout (`episodepipes.codec.chunk`) frame ``t``'s record says, per camera, how many frames back
its decode starts; `packed_members` turns the records from there to ``t`` (each checked against the index's CRC32)
into the members a frame of the members layout has. In the members layout (written before the packed one) a shard
holds one packet member per frame (``<camera>.h264``), and frame ``t`` depends on the frames from its keyframe
``t - t % gop`` (`attach_gop`). Either way a video camera's member becomes `episodepipes.codec.pack` of
``[GOP id, extradata, packets from the keyframe to t]``, so the `FrameDecoder` seam stays one member in, one frame
out. `VideoFrames` decodes through a `DecoderPool` per stream shared by the process's decode threads, whose
decoders keep their last GOPs, so consecutive frames of one GOP decode each packet once, whichever thread gets them.
"""

from __future__ import annotations

import math
import os
import threading
import zlib
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

import cv2
import numpy as np

from episodepipes.codec.chunk import Record, parse_record
from episodepipes.codec.pack import MAGIC, pack, unpack
from episodepipes.codec.pool import DecoderPool
from episodepipes.format import frame_json, npy_header
from episodepipes.index import EpisodeIndex
from episodepipes.pipes.frames import FrameDecoder, decode_jpeg
from episodepipes.pipes.sample import RawSample


def video_cameras(index: EpisodeIndex) -> dict[str, tuple[str, int]]:
    """camera -> (codec, gop) of every camera that is not JPEG; one codec per camera name across episodes."""
    seen: dict[str, tuple[str, int]] = {}
    for cameras, _ in index.tables.schemas:  # episodes share their schema's cameras: one look per schema, not episode
        for c, cam in cameras.items():
            got = seen.setdefault(c, (cam.codec, cam.gop))
            if got[0] != cam.codec:
                raise ValueError(f"camera {c!r} is {got[0]} in some episodes of {index.root} and {cam.codec} in "
                                 "others; re-shard them with one --codec")
            seen[c] = (cam.codec, max(got[1], cam.gop))  # copied streams' GOPs differ per episode: the longest
    return {c: v for c, v in seen.items() if v[0] != "jpeg"}


def attach_gop(index: EpisodeIndex, episode: str, frame: int, members: dict[str, bytes],
               earlier: Callable[[int], dict[str, bytes] | None]) -> str | None:
    """Replace each video camera's member of ``frame`` by its packed GOP up to it; returns why not, or None.

    ``earlier(f)``: frame ``f``'s members (from the reader's run, or read and CRC-checked), None when damaged.
    """
    ep = index.episode(episode)
    for c, cam in ep.cameras.items():
        if cam.codec == "jpeg":
            continue
        name = f"{c}.{cam.codec}"
        key = frame - frame % cam.gop
        packets = []
        for f in range(key, frame):
            got = earlier(f)
            if got is None:
                return f"crc32 mismatch or unreadable members in frame {f}, which this frame's GOP needs"
            if name not in got:
                return f"frame {f} of the GOP has no {name} member"
            packets.append(got[name])
        if name in members:
            shard, start, _ = ep.frame_range(key)  # the GOP by content: its keyframe's shard (sha256) and offset
            gid = f"{index.shards[shard].sha256}:{start}".encode()
            members[name] = pack([gid, cam.extradata, *packets, members[name]])
    return None


def key_frame(index: EpisodeIndex, episode: str, frame: int) -> int:
    """Packed layout: the frame whose record frame ``frame``'s decode starts at (the index's ``key`` column)."""
    ep = index.episode(episode)
    return int(index.tables.columns["key"][ep.rows[frame]]) - ep.rows.start


def parse_packed(index: EpisodeIndex, episode: str, frame: int, data: bytes | memoryview) -> Record | None:
    """Frame ``frame``'s record from its bytes, or None when they fail the CRC32 or are not a record whose
    decodes start where the index says (at or after its ``key`` frame, so no read leaves the chunk)."""
    if not checked(index, episode, frame, data):
        return None
    ep = index.episode(episode)
    try:
        rec = parse_record(data, len(ep.cameras), len(ep.arrays), where=f"episode {episode!r} frame {frame}")
    except ValueError:
        return None
    if max(rec.backs, default=0) > frame - key_frame(index, episode, frame):
        return None
    return rec


def packed_members(index: EpisodeIndex, episode: str, frame: int,
                   record: Callable[[int], Record | None]) -> tuple[dict[str, bytes | Gop], str | None]:
    """(members, why damaged) of a packed frame, from ``record(f)`` of it and the earlier frames its GOPs need.

    The members are what the members layout holds (``<camera>.jpg``, the GOP as ``<camera>.<codec>``, a `Gop`
    rather than its packed bytes, ``<array>.npy``, ``json``), so the decode stage reads both layouts alike.
    """
    rec = record(frame)
    if rec is None:
        return {}, "crc32 mismatch or not a packed record"
    ep = index.episode(episode)
    out: dict[str, bytes | Gop] = {}
    for c, name in enumerate(sorted(ep.cameras)):
        cam = ep.cameras[name]
        if cam.codec == "jpeg":
            if rec.backs[c] or len(rec.cameras[c]) != 1:
                return {}, f"camera {name!r} holds {len(rec.cameras[c])} blobs, not one JPEG"
            out[f"{name}.jpg"] = bytes(rec.cameras[c][0])  # not a view of the run: a sample must pickle
            continue
        key, packets = frame - rec.backs[c], []
        for f in range(key, frame):
            got = record(f)
            if got is None:
                return {}, f"crc32 mismatch or not a packed record in frame {f}, which this frame's GOP needs"
            packets += got.cameras[c]
        shard, start, _ = ep.frame_range(key)  # the GOP by content: its keyframe's shard (sha256) and offset
        gid = f"{index.shards[shard].sha256}:{start}".encode()
        out[f"{name}.{cam.codec}"] = Gop(gid, cam.extradata, (*packets, *rec.cameras[c]))
    arrays, why = array_members(index, episode, rec)
    if why is not None:
        return {}, why
    out.update(arrays)
    out["json"] = frame_json(episode, frame, ep.fps)
    return out, None


class Gop:
    """A video camera's member as `packed_members` hands it on: the GOP's id, its stream's extradata and the
    packets from its keyframe to the frame, as views of the records read, not packed into new bytes (frame t
    of a GOP would copy the t packets before it, every frame); it pickles as bytes, for decode processes."""

    __slots__ = ("gid", "extradata", "packets")

    def __init__(self, gid: bytes, extradata: bytes, packets: tuple[bytes | memoryview, ...]) -> None:
        self.gid, self.extradata, self.packets = gid, extradata, packets

    def __reduce__(self) -> tuple:
        return Gop, (bytes(self.gid), bytes(self.extradata), tuple(bytes(p) for p in self.packets))

    def __bytes__(self) -> bytes:
        """The member the members layout's `attach_gop` makes of the same packets."""
        return pack([self.gid, self.extradata, *self.packets])


def array_members(index: EpisodeIndex, episode: str, rec: Record) -> tuple[dict[str, bytes], str | None]:
    """(``<array>.npy`` members, why damaged) of one packed record: a step read for its arrays needs no GOP."""
    out: dict[str, bytes] = {}
    for (name, spec), row in zip(sorted(index.episode(episode).arrays.items()), rec.rows):
        dt = np.dtype(spec.dtype)
        if len(row) != dt.itemsize * math.prod(spec.shape):
            return {}, f"array {name!r} has {len(row)} bytes in the record, not one {spec.dtype} {spec.shape} step"
        out[f"{name}.npy"] = npy_header(dt, spec.shape) + row
    return out, None


def checked(index: EpisodeIndex, episode: str, frame: int, data: bytes) -> bool:
    """Whether ``data`` (frame ``frame``'s bytes) matches the index's CRC32 (True without checksums)."""
    want = index.episode(episode).frame_crc(frame)
    return want is None or zlib.crc32(data) == want


@dataclass(frozen=True)
class VideoFrames:
    """`FrameDecoder` of shards with video cameras (``cameras``: name -> (codec, gop)); others are JPEG.

    A video member is the packed GOP `attach_gop` or `packed_members` made; frames come back as uint8 RGB
    ``[3, H, W]``, decoded by the process's `DecoderPool` of the stream.

    ``tail``: for pipes whose frames of a GOP come in frame order (video_pipe, metric_pipe), the frames kept
    behind the one decoded (`PacketDecoder.frame`); None keeps a GOP's frames for later asks (train windows).
    """

    cameras: dict[str, tuple[str, int]] = field(default_factory=dict)
    tail: int | None = None

    def field(self, camera: str) -> str:
        v = self.cameras.get(camera)
        return f"{camera}.jpg" if v is None else f"{camera}.{v[0]}"

    def decode(self, camera: str, data: bytes | Gop, *, src: tuple[int, int], size: tuple[int, int] | None = None,
               out: np.ndarray | None = None) -> np.ndarray | None:
        v = self.cameras.get(camera)
        if v is None:
            return decode_jpeg(data, src=src, size=size, out=out)
        if isinstance(data, Gop):
            gid, extradata, packets = data.gid, data.extradata, data.packets
        else:
            try:
                gid, extradata, *packets = unpack(data, where=f"camera {camera!r}")
            except ValueError:
                return None
        if not packets or len(packets) > v[1]:
            return None
        want = tuple(size or src)
        last = len(packets) == v[1]  # a GOP of the camera's longest: no later frame needs its decoder
        pool = _pool(camera, v[0], src, bytes(extradata))
        if out is None or out.shape != (3, *want):
            out = np.empty((3, *want), np.uint8)
        if want == tuple(src):
            return pool.frame(bytes(gid), packets, len(packets) - 1, out=out, last=last, tail=self.tail)
        img = pool.frame(bytes(gid), packets, len(packets) - 1, last=last, tail=self.tail)
        if img is None:
            return None
        hwc = cv2.resize(cv2.merge([img[0], img[1], img[2]]), (want[1], want[0]), interpolation=cv2.INTER_AREA)
        cv2.split(hwc, [out[0], out[1], out[2]])
        return out


@dataclass(frozen=True)
class GopKeys:
    """The GOP a sample's frame decodes from, as its key for `episodepipes.pipes._decode.executor.InOrder`'s lanes (one
    worker per GOP in flight), and the longest GOP of the cameras, which sizes how far ahead the decode stage reads.

    ``cameras``: (camera, its member name) of the video cameras; the first one the sample holds names the GOP
    (cameras of one episode share their GOP structure when the writer encoded them; copied ones may not, and then
    a GOP of another camera may still be shared by two workers, which its `DecoderPool` serialises).
    """

    cameras: tuple[tuple[str, str], ...]
    longest: int

    @classmethod
    def of(cls, frames: FrameDecoder) -> GopKeys | None:
        """Those of a `FrameDecoder` with video cameras (a ``cameras`` dict of name -> (codec, gop)), else None."""
        video = getattr(frames, "cameras", None)
        if not isinstance(video, dict) or not video:
            return None
        return cls(tuple((c, f"{c}.{codec}") for c, (codec, _) in sorted(video.items())),
                   max(gop for _, gop in video.values()))

    def __call__(self, raw: RawSample) -> Hashable | None:
        """The GOP id of the sample's frame (a camera window: its latest step read), or None (a damaged sample, a
        JPEG episode of a mixture, or frames a process worker reads from the shard itself)."""
        for camera, name in self.cameras:
            data = raw.members.get(name)
            if data is None and camera in raw.windows and raw.windows[camera].data:
                w = raw.windows[camera]
                data = w.data[max(w.data)]
            if isinstance(data, Gop):
                return bytes(data.gid)
            if isinstance(data, bytes | memoryview) and bytes(data[:len(MAGIC)]) == MAGIC:
                try:
                    return bytes(unpack(data)[0])
                except ValueError:  # damaged: the decode says so
                    return None
        return None


_POOLS: OrderedDict[tuple, DecoderPool] = OrderedDict()  # (camera, codec, size, extradata) -> its decoders
_POOLS_LOCK = threading.Lock()
_MAX_POOLS = 8  # streams whose decoders are kept (episodes copied from many files differ in extradata)


def _forget() -> None:
    """In a forked child: the parent's decoders (and a lock a parent thread may hold) are not this process's."""
    global _POOLS_LOCK
    _POOLS.clear()
    _POOLS_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget)


def _pool(camera: str, codec: str, src: tuple[int, int], extradata: bytes) -> DecoderPool:
    """The process's decoders of one stream, shared by its decode threads (`DecoderPool` says why)."""
    key = (camera, codec, tuple(src), extradata)
    with _POOLS_LOCK:
        pool = _POOLS.get(key)
        if pool is None:
            pool = _POOLS[key] = DecoderPool(codec, extradata, size=tuple(src))
            while len(_POOLS) > _MAX_POOLS:
                _POOLS.popitem(last=False)
        _POOLS.move_to_end(key)
        return pool
