"""`AtomicMp4`: an mp4 that appears under its final name complete, or not at all.

H.264 through PyAV when it is installed (browsers, so the W&B and TensorBoard UIs, play it), else OpenCV's
MPEG-4 Part 2. Frames go to a hidden ``.<name>.partial.mp4`` next to the target (same folder, so the rename is
atomic; it must end in ``.mp4`` because OpenCV picks the container from the extension), and
``close()`` moves it into place with ``os.replace``. An exception inside the ``with`` block discards it;
a killed process leaves only the hidden partial file, which `remove_partials` clears.
"""

from __future__ import annotations

import contextlib
import logging
import os
from fractions import Fraction
from pathlib import Path
from types import TracebackType

import cv2
import numpy as np

from episodepipes.format import finite

log = logging.getLogger(__name__)
PARTIAL = ".partial.mp4"


def partial_path(path: Path) -> Path:
    """Where ``path``'s frames are written before the rename."""
    return path.with_name(f".{path.stem}{PARTIAL}")


def remove_partials(folder: Path) -> int:
    """Delete partial files a crashed writer left in ``folder``; returns how many."""
    n = 0
    for p in Path(folder).glob(f".*{PARTIAL}"):
        p.unlink(missing_ok=True)
        n += 1
    if n:
        log.info("removed %d partial video file(s) left by an interrupted run in %s", n, folder)
    return n


def even_size(rgb: np.ndarray) -> np.ndarray:
    """``rgb`` padded to an even height and width by repeating its last row/column (yuv420p needs even sizes).

    Padding, not cropping: no drawn pixel is lost and pixel coordinates keep their meaning (the pad is at
    the bottom and right edge). Both encoders get the padded frame, so the file's size does not depend on
    which one is installed.
    """
    h, w = rgb.shape[:2]
    if h % 2 == 0 and w % 2 == 0:
        return rgb
    return np.pad(rgb, ((0, h % 2), (0, w % 2), (0, 0)), mode="edge")


def h264_encoder() -> str | None:
    """The name of PyAV's H.264 encoder (``libx264`` preferred), or None without PyAV or without one."""
    try:
        import av
    except ImportError:
        return None
    return next((name for name in ("libx264", "h264") if name in av.codecs_available), None)


class _PyAV:
    """H.264 (yuv420p) in mp4 through PyAV: plays in browsers, hence in the W&B and TensorBoard web UIs."""

    def __init__(self, path: Path, fps: float, size: tuple[int, int], encoder: str) -> None:
        import av

        # moov atom first ("faststart"): a browser starts playing before the whole file has arrived
        self.container = av.open(str(path), mode="w", format="mp4", options={"movflags": "+faststart"})
        self.stream = self.container.add_stream(encoder, rate=Fraction(fps).limit_denominator(1_000_000))
        self.stream.height, self.stream.width = size
        self.stream.pix_fmt = "yuv420p"
        if encoder == "libx264":  # fast: rank 0 encodes while the other ranks wait
            self.stream.options = {"preset": "veryfast", "crf": "23"}
        self.container.start_encoding()  # create the file now: the encoder holds back its first frames
        self._av = av

    def write(self, rgb: np.ndarray) -> None:
        frame = self._av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")
        self.container.mux(self.stream.encode(frame))

    def release(self) -> None:
        self.container.mux(self.stream.encode())  # flush the encoder's delayed frames
        self.container.close()


class _OpenCV:
    """MPEG-4 Part 2 (``mp4v``) through OpenCV: always there, but browsers do not play it."""

    def __init__(self, path: Path, fps: float, size: tuple[int, int]) -> None:
        h, w = size
        self.writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), fps, (w, h))
        if not self.writer.isOpened():
            raise RuntimeError(f"OpenCV cannot open {path} for writing with fourcc='mp4v'; "
                               "check the folder is writable and OpenCV has an mp4 encoder")

    def write(self, rgb: np.ndarray) -> None:
        self.writer.write(np.ascontiguousarray(rgb[:, :, ::-1]))  # OpenCV writes BGR

    def release(self) -> None:
        self.writer.release()


class AtomicMp4:
    """Write uint8 RGB ``[H, W, 3]`` frames at ``fps`` to ``path``, atomically.

    Args:
        path: the final file name (``.mp4``).
        fps: frames per second stored in the file: the episode's source rate.
        codec: ``"auto"`` (default): H.264 through PyAV when it is installed with an H.264 encoder, else
            OpenCV's ``mp4v``; ``"h264"``: PyAV's H.264, an error without it; ``"mp4v"``: OpenCV's MPEG-4 Part 2.

    Odd frame sizes are padded to even ones (`even_size`). Use as a context manager, or call `close`
    (publish) or `discard` yourself.
    """

    def __init__(self, path: str | os.PathLike, *, fps: float, codec: str = "auto") -> None:
        if isinstance(fps, bool) or not isinstance(fps, (int, float)) or not finite(fps) or not fps > 0:
            raise ValueError(f"fps={fps!r} should be > 0 (the episode's source frame rate from the index)")
        if codec not in ("auto", "h264", "mp4v"):
            raise ValueError(f"codec={codec!r} should be 'auto', 'h264' or 'mp4v'")
        encoder = h264_encoder() if codec != "mp4v" else None
        if codec == "h264" and encoder is None:
            raise ValueError("codec='h264' needs PyAV with an H.264 encoder: `pip install av`, or use codec='auto'")
        self.path, self.fps, self.encoder = Path(path), float(fps), encoder
        self.codec = "h264" if encoder else "mp4v"  # what the file will hold
        self.tmp = partial_path(self.path)
        self.frames = 0
        self._size: tuple[int, int] | None = None
        self._writer: _PyAV | _OpenCV | None = None

    def write(self, rgb: np.ndarray) -> None:
        """Append one frame; the first frame fixes the size, and a later frame of another size is refused.

        Args:
            rgb: one uint8 RGB ``[H, W, 3]`` frame.
        """
        if rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.dtype != np.uint8:
            raise ValueError(f"frame of shape {rgb.shape} and dtype {rgb.dtype}: expected uint8 [H, W, 3] RGB")
        h, w = rgb.shape[:2]
        if self._writer is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            size = (h + h % 2, w + w % 2)
            self._writer = (_PyAV(self.tmp, self.fps, size, self.encoder) if self.encoder
                            else _OpenCV(self.tmp, self.fps, size))
            self._size = (h, w)
        elif (h, w) != self._size:
            raise ValueError(f"frame {self.frames} of {self.path.name} is {h}x{w}, earlier frames are "
                             f"{self._size[0]}x{self._size[1]}; a video needs one size")
        self._writer.write(even_size(rgb))
        self.frames += 1

    def close(self) -> Path | None:
        """Finish the file and move it to ``path``; returns ``path`` (None if no frame was written)."""
        if self._writer is None:
            return None
        try:
            self._writer.release()
        except BaseException:
            self._writer = None
            self.tmp.unlink(missing_ok=True)
            raise
        self._writer = None
        os.replace(self.tmp, self.path)
        return self.path

    def discard(self) -> None:
        """Drop the partial file; nothing appears under ``path``."""
        if self._writer is not None:
            with contextlib.suppress(Exception):  # a broken encoder must not hide why we are discarding
                self._writer.release()
            self._writer = None
        self.tmp.unlink(missing_ok=True)

    def __enter__(self) -> AtomicMp4:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is None:
            self.close()
        else:
            self.discard()
