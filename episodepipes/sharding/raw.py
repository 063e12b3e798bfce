"""`RawReader`: episodes stored as plain folders of videos or images, ``arrays.npz`` and ``meta.json``.

Layout::

    SRC/<episode_id>/<camera>.mp4          a video (.mp4 .avi .mkv .webm .mov), or
    SRC/<episode_id>/<camera>/000000.png   an image folder (.png .jpg .jpeg), frames in numeric order
    SRC/<episode_id>/arrays.npz            per-step arrays, first dimension = number of frames
    SRC/<episode_id>/meta.json             optional: {"fps": 10, "prompt": "...", "split": "val"}

The fps comes from ``meta.json``, else from the first video's container; image-only episodes
without ``meta.json`` fps are an error, because guessing a frame rate would corrupt the videos
rendered from them later. Frames are yielded in BGR, as OpenCV decodes them, so the JPEG encoder
needs no colour conversion.
"""

from __future__ import annotations

import json
import logging
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from episodepipes.sharding.episode import EpisodeData, EpisodeError
from episodepipes.sharding.video import VideoFrames

log = logging.getLogger(__name__)

VIDEO_EXTS = (".mp4", ".avi", ".mkv", ".webm", ".mov")
IMAGE_EXTS = (".png", ".jpg", ".jpeg")


def _frame_key(p: Path) -> tuple[int, int, str]:
    """Numeric order for numbered frames (``2.png`` before ``10.png``), name order otherwise."""
    return (0, int(p.stem), p.name) if p.stem.isdigit() else (1, 0, p.name)


@dataclass(frozen=True)
class ImageFrames:
    """Lazy BGR frames of an image folder; a file that does not decode is an `EpisodeError`."""

    files: tuple[Path, ...]
    where: str

    def __iter__(self) -> Iterator[np.ndarray]:
        for f in self.files:
            bgr = cv2.imread(str(f), cv2.IMREAD_COLOR)
            if bgr is None:
                raise EpisodeError(f"{self.where}: cannot decode image {f}; replace or delete the file, "
                                   "or pass --skip-bad")
            yield bgr


@dataclass(frozen=True)
class RawReader:
    """`EpisodeReader` over ``root/<episode_id>/`` folders."""

    root: Path

    def episode_ids(self) -> list[str]:
        return sorted(p.name for p in Path(self.root).iterdir() if p.is_dir() and not p.name.startswith((".", "_")))

    def read(self, episode_id: str) -> EpisodeData:
        d = Path(self.root) / episode_id
        where = f"episode {episode_id!r}"
        meta = _meta(d / "meta.json", where)
        cameras: dict = {}
        files: dict[str, str] = {}
        video_fps: float | None = None
        for p in sorted(d.iterdir()):
            if p.is_file() and p.suffix.lower() in VIDEO_EXTS:
                cam, frames = p.stem, VideoFrames(p, where)
                if video_fps is None:
                    video_fps = frames.fps()
            elif p.is_dir():
                images = sorted((f for f in p.iterdir() if f.suffix.lower() in IMAGE_EXTS), key=_frame_key)
                if not images:
                    log.debug("%s: %s holds no images; ignored", where, p)
                    continue
                cam, frames = p.name, ImageFrames(tuple(images), where)
            else:
                continue
            if cam in cameras:
                raise EpisodeError(f"{where}: camera {cam!r} is both {files[cam]} and {p}; keep one")
            cameras[cam], files[cam] = frames, str(p)
        if not cameras:
            raise EpisodeError(f"{where}: {d} has no video ({'/'.join(VIDEO_EXTS)}) and no image folder; "
                               "add a camera or remove the folder")
        fps = meta.get("fps", video_fps)
        if not isinstance(fps, (int, float)) or not fps > 0:
            raise EpisodeError(f"{where}: no usable frame rate (fps={fps!r}); add {{\"fps\": <frames per second>}} "
                               f"to {d / 'meta.json'}")
        return EpisodeData(id=episode_id, cameras=cameras, arrays=_arrays(d / "arrays.npz", where),
                           fps=float(fps), prompt=str(meta.get("prompt", "")), split=meta.get("split"), files=files,
                           channel_order="bgr")  # OpenCV and PyAV decode to BGR at no cost


def _meta(path: Path, where: str) -> dict:
    if not path.exists():
        return {}
    try:
        meta = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise EpisodeError(f"{where}: {path} is not valid JSON ({e}); fix or delete it") from e
    if not isinstance(meta, dict):
        raise EpisodeError(f"{where}: {path} must hold a JSON object like {{\"fps\": 10}}")
    return meta


def _arrays(path: Path, where: str) -> dict[str, np.ndarray]:
    if not path.exists():
        return {}
    try:
        with np.load(path, allow_pickle=False) as npz:
            return {k: npz[k] for k in sorted(npz.files)}
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as e:
        raise EpisodeError(f"{where}: cannot read {path} ({e}); re-save it with numpy.savez") from e
