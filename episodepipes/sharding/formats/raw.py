"""`RawReader`: episodes stored as plain folders of videos or images, ``arrays.npz`` and ``meta.json``.

Layout::

    SRC/<episode_id>/<camera>.mp4          a video (.mp4 .avi .mkv .webm .mov), or
    SRC/<episode_id>/<camera>/000000.png   an image folder (.png .jpg .jpeg), frames in numeric order
    SRC/<episode_id>/arrays.npz            per-step arrays, first dimension = number of frames
    SRC/<episode_id>/meta.json             optional: {"fps": 10, "prompt": "...", "split": "val", ...}

The fps comes from ``meta.json``, else from the first video's container; image-only episodes
without ``meta.json`` fps are an error, because guessing a frame rate would corrupt the videos
rendered from them later, and a ``meta.json`` fps that disagrees with a video's own rate (by more
than NTSC's 29.97-for-30 rounding) is refused naming both rates, for the same reason. Other
``meta.json`` keys are kept in `EpisodeData.extra` and must be JSON scalars. Frames are yielded in
BGR, as OpenCV decodes them, so the JPEG encoder needs no colour conversion.

With ``copy=True`` (``write --codec copy``) a video camera's packets are copied from its file
(`episodepipes.codec.copy_packets`) into `EpisodeData.packets`, never decoded; an image folder has none
to copy and stays frames, which the shard writer stores as JPEG.

Everything is read from inside SRC: links (episode folders, cameras, frames, ``meta.json``,
``arrays.npz``) are resolved, followed when they stay inside SRC and refused by name when they leave it.
``arrays.npz`` is loaded without pickle; object and text arrays are refused by name.
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

from episodepipes.codec.stream import Packets
from episodepipes.sharding.episode import (
    EpisodeData,
    EpisodeError,
    check_array,
    check_extra,
    check_fps,
    check_text,
    resolve_inside,
)
from episodepipes.sharding.formats.imagehead import check_header, read_image
from episodepipes.sharding.formats.video import VideoFrames

log = logging.getLogger(__name__)

VIDEO_EXTS = (".mp4", ".avi", ".mkv", ".webm", ".mov")
IMAGE_EXTS = (".png", ".jpg", ".jpeg")
MAX_META_BYTES = 1 << 20  # meta.json holds a few fields; a bigger one is not metadata
RATE_TOLERANCE = 0.005  # relative: meta.json's fps and a video's rate may differ by NTSC's 1001/1000, not more


def _frame_key(p: Path) -> tuple[int, int, str]:
    """Numeric order for numbered frames (``2.png`` before ``10.png``), name order otherwise."""
    return (0, int(p.stem), p.name) if p.stem.isascii() and p.stem.isdigit() else (1, 0, p.name)  # "²" is a digit


@dataclass(frozen=True)
class ImageFrames:
    """Lazy BGR frames of an image folder; a file that does not decode, or whose size differs from the
    first frame's, is an `EpisodeError` naming it. Files are read by Python, then decoded from memory, each
    refused by its size before it is read and by its header before it is decoded (`imagehead`)."""

    files: tuple[Path, ...]
    where: str

    def __iter__(self) -> Iterator[np.ndarray]:
        first: tuple[int, int] | None = None
        head: tuple[int, int] | None = None  # frame 0's size by its header
        for i, f in enumerate(self.files):
            try:
                data = read_image(f, f"{self.where}: image {f}")
            except OSError as e:
                raise EpisodeError(f"{self.where}: cannot read image {f} ({e}); fix or remove the file") from e
            size = check_header(data, f"{self.where}: image {f}", head, i)
            head = head or size
            bgr = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
            if bgr is None:
                raise EpisodeError(f"{self.where}: {f} is not a decodable image; replace or delete the file, "
                                   "or pass --skip-bad")
            size = (int(bgr.shape[0]), int(bgr.shape[1]))  # as decoded (EXIF may turn it)
            if first is None:
                first = size
            elif size != first:
                raise EpisodeError(f"{self.where}: image {f}: frame {i} is {size}, frame 0 was {first}; a camera's "
                                   "frames must share one size: resize or remove that file")
            yield bgr


@dataclass(frozen=True)
class RawReader:
    """`EpisodeReader` over ``root/<episode_id>/`` folders (the layout is in this module's docstring).

    Attributes:
        root: the source folder; nothing outside it is read (links leaving it are refused by name).
        copy: give video cameras as `EpisodeData.packets` copied from their files, not decoded frames (image
            folders stay frames).
    """

    root: Path
    copy: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.copy, bool):
            raise ValueError(f"copy={self.copy!r} should be True or False")

    def episode_ids(self) -> list[str]:
        return sorted(p.name for p in Path(self.root).iterdir() if p.is_dir() and not p.name.startswith((".", "_")))

    def read(self, episode_id: str) -> EpisodeData:
        root = Path(self.root).resolve()
        where = f"episode {episode_id!r}"
        if not isinstance(episode_id, str) or episode_id in ("", ".", "..") or Path(episode_id).name != episode_id:
            raise EpisodeError(f"{where}: not a folder name inside {root}; pass one of episode_ids()")
        d = resolve_inside(root / episode_id, root, where)
        if not d.is_dir():
            raise EpisodeError(f"{where}: {d} is not a folder; pass one of episode_ids()")
        meta = _meta(d / "meta.json", root, where)
        arrays = _arrays(d / "arrays.npz", root, where)
        steps = {a.shape[0] for a in arrays.values() if a.ndim}
        expected = steps.pop() if len(steps) == 1 else None  # unequal arrays: the encoder names them
        cameras: dict = {}
        packets: dict[str, Packets] = {}
        files: dict[str, str] = {}
        video_fps: float | None = None
        for p in sorted(d.iterdir()):
            if p.suffix.lower() in VIDEO_EXTS and not p.is_file() and not p.is_dir():  # never a camera dropped unsaid
                raise EpisodeError(f"{where}: {p} is not a regular file (a FIFO, device or broken link); replace it "
                                   "by the video, or remove it")
            if p.is_file() and p.suffix.lower() in VIDEO_EXTS:
                cam, frames = p.stem, VideoFrames(resolve_inside(p, root, where), where, expected)
                if "fps" in meta:
                    _same_rate(meta["fps"], frames.fps(), where, d / "meta.json", p)
                elif video_fps is None:
                    rate = frames.fps()
                    video_fps = None if rate is None else check_fps(rate, f"{where} video {p}")
            elif p.is_dir():
                images = _images(resolve_inside(p, root, where), root, where)
                if not images:
                    log.debug("%s: %s holds no images; ignored", where, p)
                    continue
                cam, frames = p.name, ImageFrames(images, where)
            else:
                continue
            if cam in cameras or cam in packets:
                raise EpisodeError(f"{where}: camera {cam!r} is both {files[cam]} and {p}; keep one")
            if self.copy and isinstance(frames, VideoFrames):
                packets[cam], files[cam] = _copied(frames.path, f"{where} camera {cam!r}"), str(p)
            else:
                cameras[cam], files[cam] = frames, str(p)
        if not cameras and not packets:
            raise EpisodeError(f"{where}: {d} has no video ({'/'.join(VIDEO_EXTS)}) and no image folder; "
                               "add a camera or remove the folder")
        fps = meta.pop("fps", video_fps)
        if fps is None:
            raise EpisodeError(f"{where}: no usable frame rate; add {{\"fps\": <frames per second>}} "
                               f"to {d / 'meta.json'}")
        return EpisodeData(id=episode_id, cameras=cameras, arrays=arrays, fps=fps, prompt=meta.pop("prompt", ""),
                           split=meta.pop("split", None), files=files, extra=meta, packets=packets,
                           channel_order="bgr")  # OpenCV and PyAV decode to BGR at no cost


def _same_rate(fps: float, rate: float | None, where: str, meta: Path, video: Path) -> None:
    """Refuse a ``meta.json`` fps that disagrees with a video's own rate: every timestamp and rendered video would
    run at the wrong speed. NTSC's rounding (29.97 written as 30, 23.976 as 24) is within `RATE_TOLERANCE`."""
    if rate is not None and abs(fps - rate) > RATE_TOLERANCE * rate:
        raise EpisodeError(f"{where}: {meta} says fps {fps:g} but {video} plays at {rate:g} frames/s, so every "
                           f"timestamp would be wrong; set \"fps\": {rate:g} in meta.json (or drop it to take the "
                           f"video's), or re-encode the video at {fps:g} fps")


def _copied(path: Path, where: str) -> Packets:
    """Every packet of ``path``'s video, copied; copy_packets' refusals (GOP, B-frames, codec) name the fix."""
    import av

    from episodepipes.codec.copy import copy_packets  # not at import: codec.copy imports this package

    try:
        return copy_packets(path)
    except (av.FFmpegError, OSError) as e:
        raise EpisodeError(f"{where}: cannot read video {path} ({type(e).__name__}: {e}); re-copy or re-encode "
                           "it, or pass --skip-bad") from e
    except ValueError as e:
        raise EpisodeError(f"{where}: {e}") from None


def _images(folder: Path, root: Path, where: str) -> tuple[Path, ...]:
    """A camera folder's image files, in frame order; links are resolved and must stay inside ``root``."""
    out = []
    for f in sorted((f for f in folder.iterdir() if f.suffix.lower() in IMAGE_EXTS), key=_frame_key):
        real = resolve_inside(f, root, where) if f.is_symlink() else f  # folder is resolved already
        if not real.is_file():
            raise EpisodeError(f"{where}: {f} is not a regular file; remove it from the image folder")
        out.append(real)
    return tuple(out)


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict:
    keys = [k for k, _ in pairs]
    dup = sorted({k for k in keys if keys.count(k) > 1})
    if dup:
        raise ValueError(f"keys {dup} appear more than once")
    return dict(pairs)


def _meta(path: Path, root: Path, where: str) -> dict:
    """meta.json's fields, checked: fps a positive finite number, prompt and split strings, the rest scalars."""
    if not path.exists() and not path.is_symlink():
        return {}
    real = resolve_inside(path, root, where)
    if not real.is_file() or real.stat().st_size > MAX_META_BYTES:
        raise EpisodeError(f"{where}: {path} is not a file of at most {MAX_META_BYTES} bytes; meta.json holds "
                           "a JSON object like {\"fps\": 10}")
    try:
        meta = json.loads(real.read_bytes().decode("utf-8"), object_pairs_hook=_no_duplicates)
    except RecursionError as e:
        raise EpisodeError(f"{where}: {path} is nested too deeply to be metadata; meta.json holds a flat JSON "
                           "object like {\"fps\": 10}") from e
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError, as are duplicate keys
        raise EpisodeError(f"{where}: {path} is not valid JSON ({e}); fix or delete it") from e
    if not isinstance(meta, dict):
        raise EpisodeError(f"{where}: {path} must hold a JSON object like {{\"fps\": 10}}, not a "
                           f"{type(meta).__name__}")
    file = f"{where} {path}"
    if "fps" in meta:
        meta["fps"] = check_fps(meta["fps"], file)
    check_text("prompt", meta.get("prompt", ""), file)
    check_text("split", meta.get("split"), file, optional=True)
    return check_extra(meta, file)


def _arrays(path: Path, root: Path, where: str) -> dict[str, np.ndarray]:
    """arrays.npz, loaded without pickle: object arrays are refused, as are text and other non-numbers."""
    if not path.exists() and not path.is_symlink():
        return {}
    real = resolve_inside(path, root, where)
    if not real.is_file():
        raise EpisodeError(f"{where}: {path} is not a file; re-save it with numpy.savez")
    out: dict[str, np.ndarray] = {}
    try:
        with open(real, "rb") as f:
            if f.read(4) not in (b"PK\x03\x04", b"PK\x05\x06"):  # np.load would try .npy and pickle otherwise
                raise EpisodeError(f"{where}: {path} is not a .npz (zip) archive; re-save it with numpy.savez")
            f.seek(0)
            with np.load(f, allow_pickle=False) as npz:
                for k in sorted(npz.files):
                    try:
                        a = npz[k]
                    except ValueError as e:  # object arrays need pickle, which is never allowed here
                        raise EpisodeError(f"{where}: array {k!r} in {path} cannot be loaded without pickle ({e}); "
                                           "convert it to numbers, or put text in meta.json") from e
                    out[k] = check_array(k, a, f"{where} {path}")
    except EpisodeError:
        raise
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as e:
        raise EpisodeError(f"{where}: cannot read {path} ({e}); re-save it with numpy.savez") from e
    return out
