"""Copy one camera's packets out of an existing video file, without decoding them (``--codec copy``).

A source GOP longer than ``max_gop`` is refused: reading one frame decodes from its keyframe, so a sparse
read decodes ``(gop + 1) / 2`` frames on average (15.5 at MAX_GOP, one second at 30 fps, against 1.5 at
LeRobot's GOP 2), and a chunk of packets must hold whole GOPs. Streams whose decode order differs from
presentation order (B-frames, open GOPs) are refused too: frame t's packet would no longer be the last one
its decode needs.

An episode that starts mid-GOP (LeRobot v3 puts several episodes in one mp4, cut anywhere) keeps the packets
from the keyframe before its first frame: they are decoded and dropped (`Packets.lead`), so every frame is
exactly what a decode of the whole file gives, and no frame is re-encoded. It costs at most ``max_gop - 1``
extra packets per episode and camera.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import av
import numpy as np

from episodepipes.codec.stream import DECODERS, Packets
from episodepipes.sharding.video import DEMUXERS

MAX_GOP = 30


class Copied(NamedTuple):
    """`copy_timed`'s result: the packets, and when each is shown, so a caller that matches rows to frames by
    time (the LeRobot reader) needs no second pass over the file."""

    packets: Packets
    times: np.ndarray  # float64 seconds per packet of ``packets.data`` (leading packets included), increasing


def copy_packets(path: str | Path, *, start: float = 0.0, end: float | None = None,
                 max_gop: int = MAX_GOP) -> Packets:
    """The packets of the frames shown in ``[start, end)`` seconds (half a frame of slack) of ``path``'s
    first video stream, plus any leading packets their first GOP needs."""
    return copy_timed(path, start=start, end=end, max_gop=max_gop).packets


def copy_timed(path: str | Path, *, start: float = 0.0, end: float | None = None,
               max_gop: int = MAX_GOP) -> Copied:
    """`copy_packets`, plus the time each copied packet is shown at, from the same single open of ``path``."""
    path = Path(path)
    fmt = DEMUXERS.get(path.suffix.lower())
    if fmt is None:
        raise ValueError(f"{path}: unknown video extension; use one of {', '.join(DEMUXERS)}")
    with open(path, "rb") as f, av.open(f, format=fmt) as c:  # the demuxer comes from the name, never the bytes
        if not c.streams.video:
            raise ValueError(f"{path}: no video stream to copy")
        stream = c.streams.video[0]
        cc = stream.codec_context
        name = cc.codec.canonical_name  # the bitstream's name, not the decoder PyAV picked (libdav1d for av1)
        if name not in DECODERS:
            raise ValueError(f"{path}: its video is {name}, which copy does not take ({sorted(DECODERS)}); "
                             "re-encode it with --codec av1")
        packets, times = _demux(c, stream, start, end)
        if not packets:
            raise ValueError(f"{path}: its video stream has no packets")
        pts = np.array([p.pts for p in packets], np.int64)
        if np.any(np.diff(pts) <= 0):
            raise ValueError(f"{path}: its video reorders frames (B-frames or open GOPs: presentation order differs "
                             "from decode order), which copy does not take; re-encode it with --codec av1")
        half = _half_frame(stream, times)
        keep = np.flatnonzero((times >= start - half) & (times < (np.inf if end is None else end - half)))
        if not len(keep):
            raise ValueError(f"{path}: no frame lies within [{start}, {end}) s; check the episode's timestamps")
        keys = np.array([p.is_keyframe for p in packets])
        key_of = np.maximum.accumulate(np.where(keys, np.arange(len(keys)), -1))
        first, last = int(keep[0]), int(keep[-1])
        if key_of[first] < 0:
            raise ValueError(f"{path}: frame at {times[first]:.3f}s has no keyframe before it; the file starts "
                             "mid-stream, re-encode it with --codec av1")
        lo = int(key_of[first])
        gop = int((np.arange(lo, last + 1) - key_of[lo:last + 1]).max()) + 1
        if gop > max_gop:
            raise ValueError(f"{path}: its keyframes are up to {gop} frames apart, more than {max_gop=}, so a random "
                             f"read would decode up to {gop} frames; re-encode it with --codec av1 (short GOPs)")
        data = [bytes(p) for p in packets[lo:last + 1]]
        return Copied(Packets(name, bytes(cc.extradata or b""), cc.height, cc.width, data,
                              key_of[lo:last + 1] - lo, first - lo), times[lo:last + 1])


def _half_frame(stream: av.video.stream.VideoStream, times: np.ndarray) -> float:
    rate = stream.average_rate
    if rate:
        return 0.5 / float(rate)
    return float(np.median(np.diff(times))) / 2 if len(times) > 1 else 0.5


def _demux(c: av.container.InputContainer, stream: av.video.stream.VideoStream, start: float,
           end: float | None) -> tuple[list[av.Packet], np.ndarray]:
    """Packets from the last keyframe at or before ``start`` to the last frame before ``end`` (seeking, so an
    episode late in a big shared file does not demux all of it); from the file start if the seek overshoots."""
    tb, half = float(stream.time_base), _half_frame(stream, np.zeros(0))
    for seek in ([start, 0.0] if start > 0 else [0.0]):
        c.seek(int(max(seek - half, 0) / tb), stream=stream, backward=True, any_frame=False)
        packets = []
        for p in c.demux(stream):
            if not p.size or p.pts is None:
                continue
            if end is not None and p.pts * tb >= end - half and packets:
                break
            packets.append(p)
        times = np.array([p.pts * tb for p in packets], np.float64)
        if seek == 0.0 or (len(times) and times[0] <= start - half and packets[0].is_keyframe):
            return packets, times
    raise AssertionError("unreachable")  # the last seek is to 0
