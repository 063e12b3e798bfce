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

import weakref
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, NamedTuple

import av
import numpy as np

from episodepipes.codec.stream import DECODERS, DEMUXERS, Packets

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
    with VideoSource(path) as src:
        return src.take(start, end, max_gop=max_gop)


class VideoSource:
    """One video file, open for several `take` calls (the episodes that share a LeRobot v3 mp4); a context manager.

    The packets from the keyframe before the last take's end stay demuxed, so a take that starts where the last
    one ended (the next episode of the file) continues the demux there: the file is opened once and each of its
    packets demuxed once, where a take per episode from scratch reopened it, seeked and demuxed the GOP before
    each episode again. Any other take seeks.
    """

    def __init__(self, path: str | Path, *, counts: Counter | None = None) -> None:
        """Open ``path`` (its demuxer chosen by its suffix); ``counts`` (if given) gets +1 "opened" now and +1
        "demuxed" per packet demuxed, for a caller that keeps one tally over many files."""
        self.path = path = Path(path)
        fmt = DEMUXERS.get(path.suffix.lower())
        if fmt is None:
            raise ValueError(f"{path}: unknown video extension; use one of {', '.join(DEMUXERS)}")
        self._file = open(path, "rb")
        try:  # the demuxer comes from the name, never the bytes
            self._c = av.open(self._file, format=fmt)
        except BaseException:
            self._file.close()
            raise
        self._closer = weakref.finalize(self, _close, self._c, self._file)  # a source dropped without close()
        if not self._c.streams.video:
            self.close()
            raise ValueError(f"{path}: no video stream to copy")
        self._stream = stream = self._c.streams.video[0]
        cc = stream.codec_context
        self.codec = cc.codec.canonical_name  # the bitstream's name, not the decoder PyAV picked (libdav1d for av1)
        if self.codec not in DECODERS:
            self.close()
            raise ValueError(f"{path}: its video is {self.codec}, which copy does not take ({sorted(DECODERS)}); "
                             "re-encode it with --codec av1")
        self._info = (bytes(cc.extradata or b""), cc.height, cc.width)
        self._tb, self._half = float(stream.time_base), _half_frame(stream, np.zeros(0))
        self._buf: list[tuple[float, av.Packet]] = []  # demuxed, from a keyframe on, followed by `_more`'s next
        self._before: float | None = None  # when the packet before `_buf` is shown (-inf: none; None: unknown)
        self._more: Iterator[av.Packet] = iter(())
        self._counts = counts if counts is not None else Counter()
        self._counts["opened"] += 1

    def __enter__(self) -> VideoSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._buf, self._more, self._before = [], iter(()), None
        self._closer()

    def take(self, start: float = 0.0, end: float | None = None, *, max_gop: int = MAX_GOP) -> Copied:
        """`copy_timed` of ``[start, end)`` in this file."""
        path, stream = self.path, self._stream
        packets, times = self._demux(start, end)
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
        return Copied(Packets(self.codec, *self._info, data, key_of[lo:last + 1] - lo, first - lo),
                      times[lo:last + 1])

    def _demux(self, start: float, end: float | None) -> tuple[list[av.Packet], np.ndarray]:
        """Packets from the last keyframe at or before ``start`` (or an earlier one) to the last frame before
        ``end``: continued from the packets kept by the last take when they reach back that far, else after a seek
        (to the file start if the seek overshoots). Keeps the packets from the keyframe the next frame needs."""
        half, buf, before = self._half, self._buf, self._before
        # the kept packets serve if no frame at or after ``start`` lies before them, and they reach ``start``
        if not (buf and buf[0][1].is_keyframe and buf[-1][0] >= start - 3 * half
                and (buf[0][0] <= start - half or (before is not None and before < start - half))):
            self._seek(start)
            buf = self._buf
        stop = len(buf)
        for k, (t, _) in enumerate(buf):  # the kept packets may reach past ``end`` already
            if end is not None and t >= end - half and k:
                stop = k
                break
        else:
            for p in self._more:
                t = p.pts * self._tb
                buf.append((t, p))
                if end is not None and t >= end - half and len(buf) > 1:
                    stop = len(buf) - 1
                    break
            else:
                stop = len(buf)
        got = buf[:stop]
        nxt = min(stop, len(buf) - 1)  # the packet after the take (or its last, at the end of the file)
        key = next((k for k in range(nxt, -1, -1) if buf[k][1].is_keyframe), 0) if buf else 0
        if key:
            self._before = buf[key - 1][0]
        self._buf = buf[key:]
        return [p for _, p in got], np.array([t for t, _ in got], np.float64)

    def _seek(self, start: float) -> None:
        stream, tb, half = self._stream, self._tb, self._half
        for seek in ([start, 0.0] if start > 0 else [0.0]):
            self._c.seek(int(max(seek - half, 0) / tb), stream=stream, backward=True, any_frame=False)
            self._more = _demuxed(self._c, stream, self._counts)
            first = next(self._more, None)
            self._buf = [] if first is None else [(first.pts * tb, first)]
            self._before = -np.inf if seek == 0.0 else None  # a seek to 0 starts at the file's start
            if seek == 0.0 or (first is not None and first.pts * tb <= start - half and first.is_keyframe):
                return


def _demuxed(container: av.container.InputContainer, stream: av.video.stream.VideoStream,
             counts: Counter) -> Iterator[av.Packet]:
    """The stream's packets from the container's position on (empty ones and those without a pts skipped)."""
    for p in container.demux(stream):
        if p.size and p.pts is not None:
            counts["demuxed"] += 1
            yield p


def _close(container: av.container.InputContainer, file: BinaryIO) -> None:
    try:
        container.close()
    finally:
        file.close()


def _half_frame(stream: av.video.stream.VideoStream, times: np.ndarray) -> float:
    rate = stream.average_rate
    if rate:
        return 0.5 / float(rate)
    return float(np.median(np.diff(times))) / 2 if len(times) > 1 else 0.5
