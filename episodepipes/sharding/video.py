"""Lazy video decoding for readers: PyAV when installed (it reads every container FFmpeg does),
OpenCV's ``VideoCapture`` otherwise. Any decode failure becomes an `EpisodeError` naming the file."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from episodepipes.sharding.episode import EpisodeError

try:
    import av
except ImportError:  # the `lerobot` extra brings PyAV; OpenCV decodes the common containers too
    av = None


@dataclass(frozen=True)
class VideoFrames:
    """BGR uint8 frames of one video file (OpenCV's order, which the JPEG encoder wants), decoded only
    while iterated."""

    path: Path
    where: str = ""

    def _fail(self, e: Exception | str) -> EpisodeError:
        return EpisodeError(f"{self.where}: cannot decode video {self.path} ({e}); re-encode or delete it, "
                            "or pass --skip-bad")

    def fps(self) -> float | None:
        """The container's average frame rate, or None when it does not say."""
        if av is not None:
            try:
                with av.open(str(self.path)) as c:
                    rate = c.streams.video[0].average_rate if c.streams.video else None
                    return float(rate) if rate else None
            except (av.FFmpegError, OSError, IndexError) as e:
                raise self._fail(e) from e
        cap = cv2.VideoCapture(str(self.path))
        try:
            if not cap.isOpened():
                raise self._fail("OpenCV cannot open it")
            fps = cap.get(cv2.CAP_PROP_FPS)
            return float(fps) if fps > 0 else None
        finally:
            cap.release()

    def __iter__(self) -> Iterator[np.ndarray]:
        return self._iter_av() if av is not None else self._iter_cv2()

    def _iter_av(self) -> Iterator[np.ndarray]:
        try:
            with av.open(str(self.path)) as c:
                if not c.streams.video:
                    raise self._fail("no video stream")
                for frame in c.decode(video=0):
                    yield frame.to_ndarray(format="bgr24")
        except (av.FFmpegError, OSError) as e:
            raise self._fail(e) from e

    def _iter_cv2(self) -> Iterator[np.ndarray]:
        cap = cv2.VideoCapture(str(self.path))
        try:
            if not cap.isOpened():
                raise self._fail("OpenCV cannot open it")
            while True:
                ok, bgr = cap.read()
                if not ok:
                    break
                yield bgr
        finally:
            cap.release()
