"""Lazy video decoding for readers: PyAV when installed (it reads every container FFmpeg does),
OpenCV's ``VideoCapture`` otherwise. Any decode failure becomes an `EpisodeError` naming the file.

The demuxer is chosen by the file's extension, never probed from its bytes: a probed "video" can be an
HLS playlist or an ffconcat list, which makes FFmpeg open other files or URLs named inside it. PyAV reads
through a Python file object, so FFmpeg opens nothing by itself. A video that decodes to fewer frames than
its container declares, or than the episode's arrays have steps, is reported as truncated, by name.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from episodepipes.codec.stream import DEMUXERS  # noqa: F401 (re-export: codec owns the table)
from episodepipes.sharding.episode import EpisodeError

try:
    import av
    from av.video.reformatter import VideoReformatter
except ImportError:  # the `lerobot` extra brings PyAV; OpenCV decodes the common containers too
    av = None

_MP4_BOXES = (b"ftyp", b"moov", b"mdat", b"wide", b"free", b"skip")


def _looks_like(head: bytes, demuxer: str) -> bool:
    """The container's magic bytes match its extension (checked before OpenCV, which probes by content)."""
    if demuxer == "mov":
        return head[4:8] in _MP4_BOXES
    if demuxer == "matroska":
        return head[:4] == b"\x1a\x45\xdf\xa3"
    return head[:4] == b"RIFF" and head[8:12] == b"AVI "


@dataclass(frozen=True)
class VideoFrames:
    """BGR uint8 frames of one video file (OpenCV's order, which the JPEG encoder wants), decoded only
    while iterated. ``expected``: the episode's step count, when its arrays say it."""

    path: Path
    where: str = ""
    expected: int | None = None

    def _fail(self, e: Exception | str) -> EpisodeError:
        return EpisodeError(f"{self.where}: cannot decode video {self.path} ({e}); the file may be truncated or "
                            "damaged: re-encode or re-copy it, or delete it, or pass --skip-bad")

    def _demuxer(self) -> str:
        fmt = DEMUXERS.get(Path(self.path).suffix.lower())
        if fmt is None:
            raise self._fail(f"unknown extension; use one of {', '.join(DEMUXERS)}")
        return fmt

    def _check_count(self, decoded: int, declared: int) -> None:
        for want, what in ((declared, "its container declares"), (self.expected or 0, "the episode's arrays have")):
            if decoded < want:
                raise EpisodeError(f"{self.where}: video {self.path} is truncated or damaged: it decoded {decoded} "
                                   f"frames, but {what} {want}; re-copy or re-encode it, or pass --skip-bad")

    def fps(self) -> float | None:
        """The container's average frame rate, or None when it does not say."""
        fmt = self._demuxer()
        if av is not None:
            try:
                with open(self.path, "rb") as f, av.open(f, format=fmt) as c:
                    rate = c.streams.video[0].average_rate if c.streams.video else None
                    return float(rate) if rate else None
            except (av.FFmpegError, OSError, IndexError, ZeroDivisionError) as e:
                raise self._fail(e) from e
        cap = self._capture(fmt)
        try:
            fps = cap.get(cv2.CAP_PROP_FPS)
            return float(fps) if fps > 0 else None
        finally:
            cap.release()

    def __iter__(self) -> Iterator[np.ndarray]:
        return self._iter_av() if av is not None else self._iter_cv2()

    def _iter_av(self) -> Iterator[np.ndarray]:
        fmt, n = self._demuxer(), 0
        try:
            with open(self.path, "rb") as f, av.open(f, format=fmt) as c:
                if not c.streams.video:
                    raise self._fail("no video stream")
                declared = max(int(c.streams.video[0].frames or 0), 0)
                bgr = VideoReformatter()  # one conversion context for the video: a frame's own builds one per frame
                for frame in c.decode(video=0):
                    n += 1
                    yield bgr.reformat(frame, format="bgr24").to_ndarray()
        except (av.FFmpegError, OSError) as e:
            raise self._fail(f"{e}, after {n} frames") from e
        self._check_count(n, declared)

    def _capture(self, fmt: str) -> cv2.VideoCapture:
        try:
            with open(self.path, "rb") as f:
                head = f.read(12)
        except OSError as e:
            raise self._fail(e) from e
        if not _looks_like(head, fmt):
            raise self._fail(f"its bytes are not a {Path(self.path).suffix} container")
        cap = cv2.VideoCapture(str(self.path))
        if not cap.isOpened():
            cap.release()
            raise self._fail("OpenCV cannot open it")
        return cap

    def _iter_cv2(self) -> Iterator[np.ndarray]:
        cap, n = self._capture(self._demuxer()), 0
        try:
            declared = max(int(cap.get(cv2.CAP_PROP_FRAME_COUNT)), 0)
            while True:
                ok, bgr = cap.read()
                if not ok:
                    break
                n += 1
                yield bgr
        finally:
            cap.release()
        self._check_count(n, declared)
