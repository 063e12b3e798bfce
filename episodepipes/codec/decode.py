"""`PacketDecoder`: frames out of packets through one PyAV codec context that lives for a pass.

No container is opened: packets go straight to the decoder. Frame ``t`` is decoded from its GOP's keyframe;
the decoder keeps the frames of the last ``keep`` GOPs it decoded and where it stopped in the newest, so
consecutive frames (a whole episode, a history window that straddles GOPs, several sparse frames of one GOP)
never decode a packet twice. Each packet gets its position in the GOP as its pts, and frames are matched back
by pts, so a decoder that holds frames back cannot shift them.

A damaged packet gives None for its frame and every later frame of its GOP (they reference it): FFmpeg raises
on bytes it cannot parse (libdav1d does for most damage), or flags the frame corrupt (the h264 decoder conceals
errors and sets the flag). Damage that still parses as valid syntax decodes to a wrong frame without notice;
the index's per-frame CRC32 is what catches that.

A decoder is bounded to the index's frame size before it decodes: a keyframe of a few hundred bytes (its CRC32
right) may declare 16000 x 16000, which FFmpeg would allocate and conceal at that size (seconds, 400 MB a frame)
before the size check below sees the frame. FFmpeg's ``max_pixels`` option caps every decoder's frames (libdav1d's
included), and an h264 SPS that declares more (in a packet or the extradata) is refused before the decoder sees
it (`episodepipes.codec.sps`), since h264 sizes its tables by the SPS before that cap applies.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Hashable, Sequence

import av
import cv2
import numpy as np

from episodepipes.codec.sps import avcc_length, declared_pixels
from episodepipes.codec.stream import DECODERS

log = logging.getLogger(__name__)


def pixel_limit(size: tuple[int, int]) -> int:
    """The most pixels a decoder of ``size`` frames may allocate a frame for: the size padded as decoders pad it
    (macroblocks of 16, field pairs of 32 rows, strides aligned to 64), far below any bomb."""
    return (size[0] + 32) * (size[1] + 64)


_GONE = object()  # a frame `PacketDecoder.frame` dropped for a forward reader: asking again decodes its GOP again


class PacketDecoder:
    """Decode GOPs of one camera stream (one codec and extradata) into uint8 RGB ``[3, H, W]`` frames.

    ``size``: the (height, width) every frame must have; a frame of another size counts as corrupt.
    ``threads``: FFmpeg threads per context; 1 suits a pool with one decoder per worker.
    ``keep``: GOPs whose frames are kept; a history window of W frames over GOPs of G needs ``ceil(W / G) + 1``.
    Frames are kept as rgb24 and moved to planes per request, into the caller's ``out`` where it fits (a batch
    row), so a returned array is the caller's to write into.
    """

    def __init__(self, codec: str, extradata: bytes = b"", *, size: tuple[int, int] | None = None,
                 threads: int = 1, keep: int = 2) -> None:
        if codec not in DECODERS:
            raise ValueError(f"codec={codec!r} should be one of {sorted(DECODERS)}")
        if threads < 1 or keep < 1:
            raise ValueError(f"{threads=} and {keep=} should be >= 1")
        self.codec, self.size, self.keep = codec, size, keep
        self._older: OrderedDict[Hashable, list] = OrderedDict()  # earlier GOPs, oldest first
        self._ctx = av.CodecContext.create(DECODERS[codec], "r")
        self._limit = pixel_limit(size) if size is not None else None
        self._nal_length = avcc_length(extradata) if codec == "h264" else 0
        self._refused = self._oversized(extradata, extradata=True)  # every frame then: not worth a decoder
        if self._limit is not None:
            self._ctx.options = {"max_pixels": str(self._limit)}
        if extradata and not self._refused:
            self._ctx.extradata = extradata
        self._ctx.thread_count = threads
        self._ctx.thread_type = "SLICE" if threads > 1 else "NONE"
        self._gop: Hashable = None
        self._frames: list[av.VideoFrame | np.ndarray | None] = []  # decoded so far, by position in the GOP
        self._pending: dict[int, av.VideoFrame] = {}  # frames that came out early (a decoder that holds some back)
        self._fed = 0  # packets of the current GOP sent to the decoder
        self._drained = False  # sent EOF: the context must be reset before it takes more packets
        self._bad: int | None = None  # the first damaged frame of this GOP: it and all after it are refused
        self.decoded = 0  # packets sent to the decoder, over this object's life (for tests and stats)

    def holds(self, gop: Hashable) -> bool:
        """Whether this decoder has decoded part of ``gop`` (the current GOP or a kept one)."""
        return gop == self._gop or gop in self._older

    def frames(self, gop: Hashable, packets: Sequence[bytes], upto: int) -> list[np.ndarray | None]:
        """Frames 0..``upto`` of the GOP whose packets start at its keyframe (``packets[0]``).

        ``gop`` names the GOP (say, its keyframe's shard and byte offset); asking again for the same one
        continues from where the last call stopped. None marks a frame that did not decode.
        """
        got = self._decoded(gop, packets, upto)
        if any(f is _GONE for f in got[:upto + 1]):  # a forward reader dropped some (see `frame`)
            self._restart(gop)
            got = self._decoded(gop, packets, upto)
        return [_rgb(got, j) for j in range(upto + 1)]

    def frame(self, gop: Hashable, packets: Sequence[bytes], t: int, *,
              out: np.ndarray | None = None, tail: int | None = None) -> np.ndarray | None:
        """Frame ``t`` of the GOP (see `frames`), written into ``out`` when it is a C-contiguous uint8
        ``[3, H, W]`` of the frame's size (else a new array); the frames before it are decoded, not converted.

        ``tail``: a reader that goes forward (whole episodes, sorted sparse frames) keeps only the ``tail`` frames
        before ``t`` and no earlier GOP: holding a GOP's frames costs a cold decoder a page fault per 4 KB it
        first touches, and such a reader asks for none of them again (one that does decodes its GOP again).
        None keeps them all (history windows ask for earlier frames).
        """
        got = self._decoded(gop, packets, t)
        img = _rgb(got, t, out)
        if tail is not None:
            for j in range(t - tail - 1, -1, -1):  # back to the last one dropped: each frame is dropped once
                if got[j] is _GONE:
                    break
                got[j] = _GONE
            self._older.clear()
        return img

    def _decoded(self, gop: Hashable, packets: Sequence[bytes], upto: int) -> list:
        """The GOP's frames so far, at least to ``upto``: VideoFrames until asked for, RGB once converted."""
        if not 0 <= upto < len(packets):
            raise ValueError(f"{upto=} should be within 0..{len(packets) - 1}, the packets given")
        if gop != self._gop and upto < len(self._older.get(gop, ())) and self._older[gop][upto] is not _GONE:
            self._older.move_to_end(gop)
            return self._older[gop]
        if gop != self._gop or (self._drained and upto >= len(self._frames)) or (
                upto < len(self._frames) and self._frames[upto] is _GONE):
            self._restart(gop)
        if upto >= len(self._frames):
            self._feed(packets, upto)
        return self._frames

    def _restart(self, gop: Hashable) -> None:
        if self._fed:
            self._ctx.flush_buffers()
        if self._frames and gop != self._gop:
            self._older[self._gop] = self._frames
        self._older.pop(gop, None)
        while len(self._older) >= self.keep:
            self._older.popitem(last=False)
        self._gop, self._frames, self._pending = gop, [], {}
        self._fed, self._drained, self._bad = 0, False, None

    def _oversized(self, data: bytes, *, extradata: bool = False) -> bool:
        """Whether ``data`` holds an h264 SPS declaring more than the pixel limit (`episodepipes.codec.sps`)."""
        if self.codec != "h264" or self._limit is None or not data:
            return False
        return declared_pixels(data, self._nal_length, extradata=extradata) > self._limit

    def _feed(self, packets: Sequence[bytes], upto: int) -> None:
        for i in range(self._fed, upto + 1):
            data = None if self._refused or self._bad is not None and i >= self._bad else bytes(packets[i])
            if data is not None and self._oversized(data):
                log.debug("%s packet %d of GOP %r declares frames beyond %s", self.codec, i, self._gop, self.size)
                data = None
            if data is None:  # too big, or depends on a damaged frame: not worth decoding
                self._mark_bad(i)
                self._fed = i + 1
                self._collect()
                continue
            pkt = av.Packet(data)
            pkt.pts = pkt.dts = i
            self._decode(pkt, i)
            self._fed = i + 1
            self._collect()
        if len(self._frames) <= upto:  # the decoder holds frames back: drain it (it must be reset to go on)
            self._decode(None, upto)
            self._drained = True
            self._collect()
            if len(self._frames) <= upto:  # packets that gave no frame even at EOF
                self._mark_bad(len(self._frames))
                self._collect()

    def _decode(self, pkt: av.Packet | None, i: int) -> None:
        try:
            out = self._ctx.decode(pkt)
        except av.FFmpegError as e:
            log.debug("%s packet %d of GOP %r does not decode: %s", self.codec, i, self._gop, e)
            self._mark_bad(i)
            return
        finally:
            self.decoded += pkt is not None
        for f in out:
            if f.pts is None or not 0 <= f.pts <= i or f.pts in self._pending:
                self._mark_bad(i)  # a frame the packets do not account for: trust nothing after it
            elif f.is_corrupt or (self.size is not None and (f.height, f.width) != tuple(self.size)):
                self._mark_bad(f.pts)
            else:
                self._pending[f.pts] = f

    def _mark_bad(self, i: int) -> None:
        self._bad = i if self._bad is None else min(self._bad, i)

    def _collect(self) -> None:
        """Move decoded frames into GOP order; a frame the decoder skipped (a later one came out) is damaged."""
        while True:
            j = len(self._frames)
            frame = self._pending.pop(j, None)
            if frame is None:
                if j >= self._fed or not (self._bad is not None and j >= self._bad or
                                          any(k > j for k in self._pending)):
                    return
                self._mark_bad(j)
            self._frames.append(None if self._bad is not None and j >= self._bad else frame)


def _rgb(frames: list, j: int, out: np.ndarray | None = None) -> np.ndarray | None:
    """Frame ``j`` as uint8 RGB ``[3, H, W]`` (in ``out`` if it fits), its rgb24 kept for a later request.

    rgb24 is what a plain PyAV decode gives (``to_ndarray(format="rgb24")``), so frames equal a direct decode
    of the source; `cv2.split` moves it to planes several times faster than a numpy transpose copy, and
    straight into the caller's array: no frame-sized buffer allocated and copied again per frame.
    """
    f = frames[j]
    if f is None:
        return None
    if isinstance(f, av.VideoFrame):  # a scaler per frame: its default slice threads cost more than the conversion
        f = frames[j] = f.to_ndarray(format="rgb24", threads=1)
    h, w = f.shape[:2]
    if out is None or out.shape != (3, h, w) or out.dtype != np.uint8 or not out.flags.c_contiguous:
        out = np.empty((3, h, w), np.uint8)
    cv2.split(f, [out[0], out[1], out[2]])
    return out
