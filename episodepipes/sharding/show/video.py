"""Frames to a browser-playable video: H.264 (yuv420p, no B-frames) in an mp4 whose index comes first
(``+faststart``), at the source's frame rate, so a ``<video>`` plays and seeks it from a data URI.

FFmpeg's faststart rewrites the file after the last frame (it moves the index before the frames), which needs a
file it can reopen by name: each video is written in a private temporary folder (mode 0700, made for it and removed
after) and read back as bytes. Nothing is written under the dataset or the page's folder.
"""

from __future__ import annotations

import contextlib
import tempfile
from fractions import Fraction
from pathlib import Path
from types import TracebackType

import av
import cv2
import numpy as np

from episodepipes.codec import X264_REPRODUCIBLE

CRF = 23  # x264's default quality: a preview, not an archive
KEYS_PER_SECOND = 1  # a key frame a second: a seek decodes at most a second of frames


def rate(fps: float) -> Fraction:
    """The frame rate as the container's exact fraction (29.97 -> 2997/100)."""
    return Fraction(repr(float(fps))).limit_denominator(1_000_000)


class Mp4:
    """Encode ``H x W x 3`` uint8 RGB frames (`add`) into an H.264 mp4's bytes (`finish`); a context manager
    that removes its temporary folder however it ends."""

    def __init__(self, fps: float, height: int, width: int) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="episodepipes-show-")
        self._path = Path(self._dir.name) / "video.mp4"
        self.size = (height, width)
        # yuv420p halves the chroma planes: x264 takes only even sides, so an odd one gets one more edge row/column
        self._pad = (height % 2, width % 2)
        self._out = av.open(str(self._path), "w", format="mp4", options={"movflags": "+faststart"})
        r = rate(fps)
        self._stream = self._out.add_stream("libx264", rate=r)
        self._stream.height, self._stream.width = height + self._pad[0], width + self._pad[1]
        self._stream.pix_fmt = "yuv420p"
        self._stream.codec_context.gop_size = max(1, round(float(r) * KEYS_PER_SECOND))
        self._stream.options = {"crf": str(CRF), "preset": "veryfast", "x264-params": "bframes=0:" + X264_REPRODUCIBLE}
        self.frames = 0

    def add(self, rgb: np.ndarray | None) -> None:
        """The next frame; None (a frame that did not decode) shows as mid grey."""
        if rgb is None:
            rgb = np.full((*self.size, 3), 128, np.uint8)
        if any(self._pad):
            rgb = cv2.copyMakeBorder(rgb, 0, self._pad[0], 0, self._pad[1], cv2.BORDER_REPLICATE)
        frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")
        frame.pts = self.frames
        self.frames += 1
        self._out.mux(self._stream.encode(frame))

    def finish(self) -> bytes:
        """The mp4's bytes, its index first; the temporary folder is removed."""
        self._out.mux(self._stream.encode(None))
        self._out.close()
        try:
            return self._path.read_bytes()
        finally:
            self._dir.cleanup()

    def __enter__(self) -> Mp4:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if kind is not None:
            with contextlib.suppress(Exception):  # the error being raised says more than a failed trailer
                self._out.close()
        self._dir.cleanup()
