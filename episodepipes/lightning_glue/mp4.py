"""`AtomicMp4`: an mp4 that appears under its final name complete, or not at all, and never over another file.

H.264 through PyAV when it is installed (browsers, so the W&B and TensorBoard UIs, play it), else OpenCV's
MPEG-4 Part 2. Frames go to a hidden partial file next to the target, named for this writer alone
(`episodepipes.lightning_glue.partials`: same folder, so publishing is atomic; it ends in ``.mp4`` because OpenCV
picks the container from the extension). The partial file is created with ``O_CREAT | O_EXCL | O_NOFOLLOW``
(`episodepipes.safefile.create`), so a planted link there is refused, and PyAV writes through that very descriptor
(``/proc/self/fd/N``), never through the name again. ``close()`` gives it the final name, or ``<stem>-v1.mp4``... if
that name is taken (`partials.publish`). An exception inside the ``with`` block discards it; a killed process
leaves only its hidden partial file, which `partials.remove_abandoned` clears once the process is provably dead.

Frame rates are checked where they are used (`episodepipes.lightning_glue.fps.check_fps`).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
from fractions import Fraction
from pathlib import Path
from types import TracebackType

import cv2
import numpy as np

from episodepipes.lightning_glue import partials
from episodepipes.lightning_glue.fps import check_fps
from episodepipes.safefile import UnsafePathError, create

log = logging.getLogger(__name__)
DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)  # EFBIG: a file size limit (RLIMIT_FSIZE, a quota)


def is_disk_full(e: BaseException) -> bool:
    """True for the errors a full disk, a quota or a file size limit raise (PyAV's included)."""
    return isinstance(e, OSError) and e.errno in DISK_FULL


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

    def __init__(self, target: str, fps: float, size: tuple[int, int], encoder: str) -> None:
        import av

        from episodepipes.codec import X264_REPRODUCIBLE  # beside av: the glue imports no codec until it writes

        # moov atom first ("faststart"): a browser starts playing before the whole file has arrived. The muxer
        # re-opens ``target`` to move it, so PyAV gets a name, not a file object: our descriptor's /proc name.
        self.container = av.open(target, mode="w", format="mp4", options={"movflags": "+faststart"})
        self.stream = self.container.add_stream(encoder, rate=Fraction(fps).limit_denominator(1_000_000))
        self.stream.height, self.stream.width = size
        self.stream.pix_fmt = "yuv420p"
        if encoder == "libx264":  # fast: rank 0 encodes while the other ranks wait
            self.stream.options = {"preset": "veryfast", "crf": "23", "x264-params": X264_REPRODUCIBLE}
        try:
            self.container.start_encoding()  # create the file now: the encoder holds back its first frames
        except BaseException:
            with contextlib.suppress(Exception):
                self.container.close()
            raise
        self._av = av

    def write(self, rgb: np.ndarray) -> None:
        frame = self._av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")
        self.container.mux(self.stream.encode(frame))

    def release(self, frames: int) -> None:
        try:
            self.container.mux(self.stream.encode())  # flush the encoder's delayed frames
        finally:
            self.container.close()  # always: an encoder error must not keep the file open


class _OpenCV:
    """MPEG-4 Part 2 (``mp4v``) through OpenCV: always there, but browsers do not play it."""

    def __init__(self, target: str, fps: float, size: tuple[int, int]) -> None:
        h, w = size
        self.path = target
        self.writer = cv2.VideoWriter(target, cv2.VideoWriter_fourcc(*"mp4v"), fps, (w, h))
        if not self.writer.isOpened():
            raise RuntimeError(f"OpenCV cannot open {target} for writing with fourcc='mp4v'; "
                               "check the folder is writable and OpenCV has an mp4 encoder")

    def write(self, rgb: np.ndarray) -> None:
        self.writer.write(np.ascontiguousarray(rgb[:, :, ::-1]))  # OpenCV writes BGR

    def release(self, frames: int) -> None:
        self.writer.release()
        # OpenCV reports no write error (a full disk leaves a file without its moov atom): read the count back
        cap = cv2.VideoCapture(self.path)
        n = int(cap.get(cv2.CAP_PROP_FRAME_COUNT)) if cap.isOpened() else -1
        cap.release()
        if n != frames:
            full = shutil.disk_usage(os.path.dirname(self.path)).free < (1 << 20)
            raise OSError(errno.ENOSPC if full else errno.EIO, "No space left on device" if full else
                          f"OpenCV wrote {max(n, 0)} of {frames} frames", self.path)


def _close_strays(fd: int) -> None:
    """Close every other descriptor of this process on ``fd``'s file: PyAV never closes the one it opened when
    writing the header fails (a full disk), even when the container is closed and collected, so it would hold
    the removed partial file's space until the process ends."""
    if not os.path.isdir("/proc/self/fd"):
        return
    mine = os.fstat(fd)
    for name in os.listdir("/proc/self/fd"):
        other = int(name)
        if other == fd:
            continue
        with contextlib.suppress(OSError):
            st = os.fstat(other)
            if (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino):
                os.close(other)


class AtomicMp4:
    """Write uint8 RGB ``[H, W, 3]`` frames at ``fps`` to ``path``, atomically, never over an existing file.

    Args:
        path: the final file name (``.mp4``). If a file (or link) already has it, `close` publishes under
            ``<stem>-v1.mp4``, ``-v2``... instead and returns that name.
        fps: frames per second stored in the file: the episode's source rate, within
            `episodepipes.lightning_glue.fps.FPS_RANGE`.
        codec: ``"auto"`` (default): H.264 through PyAV when it is installed with an H.264 encoder, else
            OpenCV's ``mp4v``; ``"h264"``: PyAV's H.264, an error without it; ``"mp4v"``: OpenCV's MPEG-4 Part 2.
        owner: the token naming this writer's partial files (`partials.run_token`; default: a fresh one).

    Odd frame sizes are padded to even ones (`even_size`). Use as a context manager, or call `close`
    (publish) or `discard` yourself.
    """

    def __init__(self, path: str | os.PathLike, *, fps: float, codec: str = "auto", owner: str | None = None) -> None:
        fps = check_fps(fps)
        if codec not in ("auto", "h264", "mp4v"):
            raise ValueError(f"codec={codec!r} should be 'auto', 'h264' or 'mp4v'")
        encoder = h264_encoder() if codec != "mp4v" else None
        if codec == "h264" and encoder is None:
            raise ValueError("codec='h264' needs PyAV with an H.264 encoder: `pip install av`, or use codec='auto'")
        self.path, self.fps, self.encoder = Path(path), fps, encoder
        self.codec = "h264" if encoder else "mp4v"  # what the file will hold
        self.tmp = partials.partial_path(self.path, owner or partials.run_token())
        self.frames = 0
        self._size: tuple[int, int] | None = None
        self._writer: _PyAV | _OpenCV | None = None
        self._fd: int | None = None  # our descriptor of the partial file: its lock, and PyAV's way in

    def write(self, rgb: np.ndarray) -> None:
        """Append one frame; the first frame fixes the size, and a later frame of another size is refused.

        Args:
            rgb: one uint8 RGB ``[H, W, 3]`` frame.
        """
        if rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.dtype != np.uint8:
            raise ValueError(f"frame of shape {rgb.shape} and dtype {rgb.dtype}: expected uint8 [H, W, 3] RGB")
        h, w = rgb.shape[:2]
        if self._fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = create(self.tmp, replace=False)  # O_EXCL | O_NOFOLLOW: a planted link is refused
            partials.lock(self._fd)
            size = (h + h % 2, w + w % 2)
            try:
                self._writer = (_PyAV(self._target(), self.fps, size, self.encoder) if self.encoder
                                else _OpenCV(str(self.tmp), self.fps, size))
            except BaseException:
                self.discard()
                raise
            self._size = (h, w)
        elif (h, w) != self._size:
            raise ValueError(f"frame {self.frames} of {self.path.name} is {h}x{w}, earlier frames are "
                             f"{self._size[0]}x{self._size[1]}; a video needs one size")
        self._writer.write(even_size(rgb))
        self.frames += 1

    def _target(self) -> str:
        """The name PyAV opens: our descriptor's, where the OS has one (Linux), so no link swapped in is followed."""
        proc = f"/proc/self/fd/{self._fd}"
        return proc if os.path.exists(proc) else str(self.tmp)

    def close(self) -> Path | None:
        """Finish the file and give it its name; returns that name (``path``, or ``<stem>-vN.mp4`` when ``path``
        is taken), None if no frame was written. On an error nothing stays behind: no partial file, no descriptor."""
        if self._writer is None:
            self.discard()
            return None
        writer, self._writer = self._writer, None
        try:
            writer.release(self.frames)
            self._check_ours()
            published = partials.publish(self.tmp, self.path)
        except BaseException:
            self.discard()
            raise
        self._close_fd()
        return published

    def discard(self) -> None:
        """Drop the partial file; nothing appears under ``path``."""
        if self._writer is not None:
            with contextlib.suppress(Exception):  # a broken encoder must not hide why we are discarding
                self._writer.release(self.frames)
            self._writer = None
        if self._fd is not None:
            _close_strays(self._fd)
            with contextlib.suppress(OSError):
                self._check_ours()  # only our own file is removed, never one swapped in under its name
                self.tmp.unlink()
        self._close_fd()

    def _check_ours(self) -> None:
        """Refuse to publish or remove whatever now has the partial name unless it is the file we created."""
        mine, there = os.fstat(self._fd), os.lstat(self.tmp)
        if (mine.st_dev, mine.st_ino) != (there.st_dev, there.st_ino):
            raise UnsafePathError(self.tmp, "a file swapped in while the video was written")

    def _close_fd(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> AtomicMp4:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is None:
            self.close()
        else:
            self.discard()
