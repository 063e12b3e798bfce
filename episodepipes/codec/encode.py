"""Encode one camera's RGB frames into short GOPs of h264 (libx264) or AV1 (libsvtav1) packets.

No B-frames (AV1 shows frames in the order its temporal units come), so decode order is presentation
order; a keyframe every ``gop`` frames exactly, and nothing else a keyframe, so frame ``t`` depends on frame
``t - t % gop``. Streams are raw packets: h264 repeats its parameter sets at every keyframe and AV1 its
sequence header, so a GOP decodes on its own and no container is needed.
"""

from __future__ import annotations

import contextlib
import fractions
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import av
import cv2
import numpy as np

from episodepipes.codec.stream import Packets

CODECS = ("h264", "av1")
DEFAULT_CRF = {"h264": 18, "av1": 30}  # AV1 at LeRobot's crf; h264 at x264's "visually lossless" mark
_ENCODER = {"h264": "libx264", "av1": "libsvtav1"}


@dataclass(frozen=True, kw_only=True)
class CodecOptions:
    """``codec``: h264 or av1; ``gop``: frames per keyframe; ``crf``: quality (lower is better, per codec's scale);
    ``preset``: the encoder's speed/size trade (libx264 names, libsvtav1 numbers 0-13); ``fast_decode``: h264
    without CABAC and deblocking (x264's ``tune=fastdecode``), cheaper to decode for some more bytes."""

    codec: str = "av1"
    gop: int = 2
    crf: int | None = None
    preset: str | None = None
    fast_decode: bool = False

    def __post_init__(self) -> None:
        if self.codec not in CODECS:
            raise ValueError(f"codec={self.codec!r} should be one of {CODECS}")
        if not 1 <= self.gop <= 1000:
            raise ValueError(f"gop={self.gop} should be within 1..1000")
        top = 51 if self.codec == "h264" else 63
        if self.crf is not None and not 0 <= self.crf <= top:
            raise ValueError(f"crf={self.crf} should be within 0..{top} for {self.codec}")
        if self.fast_decode and self.codec != "h264":
            raise ValueError(f"fast_decode=True is for h264 only, not codec={self.codec!r}")

    def encoder_options(self) -> dict[str, str]:
        crf = str(DEFAULT_CRF[self.codec] if self.crf is None else self.crf)
        if self.codec == "h264":
            g = self.gop
            return {"crf": crf, "preset": self.preset or "veryfast", "bf": "0", "g": str(g),
                    "x264-params": f"keyint={g}:min-keyint={g}:scenecut=0:bframes=0",
                    **({"tune": "fastdecode"} if self.fast_decode else {})}
        return {"crf": crf, "preset": self.preset or "8", "g": str(self.gop)}


@contextlib.contextmanager
def same_scheduling() -> Iterator[None]:
    """libsvtav1 run as root switches the encoding thread to SCHED_FIFO 99; put the thread back as it was,
    or every thread and worker it starts later inherits real-time priority (and a busy-polling one starves)."""
    if not hasattr(os, "sched_getscheduler"):
        yield
        return
    policy, param = os.sched_getscheduler(0), os.sched_getparam(0)
    try:
        yield
    finally:
        if (os.sched_getscheduler(0), os.sched_getparam(0)) != (policy, param):
            os.sched_setscheduler(0, policy, param)


def _check(frame: np.ndarray, shape: tuple[int, ...] | None, i: int) -> tuple[int, ...]:
    if frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[2] != 3:
        raise ValueError(f"frame {i}: {frame.shape=} {frame.dtype=} should be (H, W, 3) uint8")
    if shape is not None and frame.shape != shape:
        raise ValueError(f"frame {i}: {frame.shape=} differs from the first frame's {shape}; resize the camera")
    h, w = frame.shape[:2]
    if h % 2 or w % 2 or h < 16 or w < 16:
        raise ValueError(f"frame {i}: {h}x{w} should be even and at least 16x16 for yuv420p; resize it (--resize)")
    return frame.shape


def encode_frames(frames: Iterable[np.ndarray], options: CodecOptions = CodecOptions(), *,
                  channel_order: str = "rgb") -> Packets:
    """Encode (H, W, 3) uint8 frames as yuv420p packets; one packet per frame, in frame order.

    ``channel_order``: "rgb", or "bgr" for readers that decode with OpenCV (`EpisodeData.channel_order`).
    BGR goes to RGB first (swscale rounds the two differently), so the packets never depend on the reader.
    """
    if channel_order not in ("rgb", "bgr"):
        raise ValueError(f"channel_order={channel_order!r} should be 'rgb' or 'bgr'")
    with same_scheduling():
        return _encode(frames, options, channel_order == "bgr")


# x264's MB-tree off: its per-macroblock qp offsets are computed from lookahead values that valgrind shows come from
# uninitialised stack memory, so the same frames gave other packets now and then within one process (a resumed or
# merged write differed from a single one; a `show` page differed from the same page). Every x264 encoder here sets it.
X264_REPRODUCIBLE = "mbtree=0"


def _reproducible(options: CodecOptions) -> dict[str, str]:
    """The encoder options, made reproducible (`X264_REPRODUCIBLE`)."""
    opts = options.encoder_options()
    if options.codec == "h264":
        opts["x264-params"] += ":" + X264_REPRODUCIBLE
    return opts


def _encode(frames: Iterable[np.ndarray], options: CodecOptions, bgr: bool) -> Packets:
    ctx, shape, out = None, None, []
    for i, frame in enumerate(frames):
        shape = _check(frame, shape, i)
        if ctx is None:
            if options.codec == "av1":  # SVT-AV1 prints ~40 "Svt[info]" lines per encoder to stderr; keep its
                os.environ.setdefault("SVT_LOG", "1")  # errors (1: fatal and error); a user's own SVT_LOG wins
            ctx = av.CodecContext.create(_ENCODER[options.codec], "w")
            ctx.height, ctx.width = shape[:2]
            ctx.pix_fmt, ctx.time_base, ctx.framerate = "yuv420p", fractions.Fraction(1, 30), 30
            ctx.options = _reproducible(options)
            if options.codec == "h264":  # x264's frame threads gave other bytes now and then on a loaded machine
                ctx.thread_count = 1  # (seen as a resumed write differing from one run); shards must be reproducible
        rgb = cv2.cvtColor(frame, cv2.COLOR_BGR2RGB) if bgr else np.ascontiguousarray(frame)
        vf = av.VideoFrame.from_ndarray(rgb, format="rgb24").reformat(format="yuv420p")
        vf.pts = i
        out += ctx.encode(vf)
    if ctx is None:
        raise ValueError("no frames to encode; an empty camera cannot be a video")
    out += ctx.encode(None)
    out.sort(key=lambda p: p.pts)  # already in order (no reordering); sorted so the index math cannot drift
    if [p.pts for p in out] != list(range(i + 1)):
        raise ValueError(f"{ctx.name} gave packets for pts {[p.pts for p in out]}, not one per frame 0..{i}")
    key = np.zeros(len(out), np.int64)
    for j, p in enumerate(out):
        key[j] = j if p.is_keyframe else key[j - 1]
    if not out[0].is_keyframe:
        raise ValueError(f"{ctx.name}'s first packet is not a keyframe")
    return Packets(options.codec, bytes(ctx.extradata or b""), shape[0], shape[1], [bytes(p) for p in out], key)
