"""`AtomicMp4`: an mp4 that appears under its final name complete, or not at all.

Frames go to a hidden ``.<name>.partial.mp4`` next to the target (same folder, so the rename is
atomic; it must end in ``.mp4`` because OpenCV picks the container from the extension), and
``close()`` moves it into place with ``os.replace``. An exception inside the ``with`` block discards it;
a killed process leaves only the hidden partial file, which `remove_partials` clears.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from types import TracebackType

import cv2
import numpy as np

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


class AtomicMp4:
    """Write uint8 RGB ``[H, W, 3]`` frames at ``fps`` to ``path`` (``mp4v`` codec), atomically.

    Use as a context manager, or call `close` (publish) or `discard` yourself.
    """

    def __init__(self, path: str | os.PathLike, *, fps: float, fourcc: str = "mp4v") -> None:
        if not fps > 0:
            raise ValueError(f"fps={fps!r} should be > 0 (the episode's source frame rate from the index)")
        self.path, self.fps, self.fourcc = Path(path), float(fps), fourcc
        self.tmp = partial_path(self.path)
        self.frames = 0
        self._size: tuple[int, int] | None = None
        self._writer: cv2.VideoWriter | None = None

    def write(self, rgb: np.ndarray) -> None:
        """Append one frame; the first frame fixes the size."""
        if rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.dtype != np.uint8:
            raise ValueError(f"frame of shape {rgb.shape} and dtype {rgb.dtype}: expected uint8 [H, W, 3] RGB")
        h, w = rgb.shape[:2]
        if self._writer is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._writer = cv2.VideoWriter(str(self.tmp), cv2.VideoWriter_fourcc(*self.fourcc), self.fps, (w, h))
            if not self._writer.isOpened():
                raise RuntimeError(f"OpenCV cannot open {self.tmp} for writing with fourcc={self.fourcc!r}; "
                                   "check the folder is writable and OpenCV has an mp4 encoder")
            self._size = (h, w)
        elif (h, w) != self._size:
            raise ValueError(f"frame {self.frames} of {self.path.name} is {h}x{w}, earlier frames are "
                             f"{self._size[0]}x{self._size[1]}; a video needs one size")
        self._writer.write(np.ascontiguousarray(rgb[:, :, ::-1]))  # OpenCV writes BGR
        self.frames += 1

    def close(self) -> Path | None:
        """Finish the file and move it to ``path``; returns ``path`` (None if no frame was written)."""
        if self._writer is None:
            return None
        self._writer.release()
        self._writer = None
        os.replace(self.tmp, self.path)
        return self.path

    def discard(self) -> None:
        """Drop the partial file; nothing appears under ``path``."""
        if self._writer is not None:
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
