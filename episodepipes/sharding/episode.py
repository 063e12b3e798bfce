"""The reader protocol: how any dataset layout becomes episodes for the shard writer.

A reader is a small picklable object (it is sent to encoder processes) with two methods::

    class MyReader:
        def episode_ids(self) -> list[str]: ...          # sorted, stable
        def read(self, episode_id: str) -> EpisodeData: ...

`EpisodeData.cameras` maps a camera name to an iterable of HxWx3 uint8 frames, produced
lazily so a long video is never held twice. Frames are RGB unless ``channel_order="bgr"``: a reader
that decodes with OpenCV (or PyAV's ``bgr24``) yields BGR as is, and the JPEG encoder, which wants
BGR, then skips a colour conversion that costs a quarter of the encode. Arrays are per-step:
first dimension = frames.

A reader that copies compressed video instead (``write --codec copy``) puts a camera's `Packets` in
`EpisodeData.packets` and leaves it out of ``cameras``: nothing is decoded. Such a reader says so with a
``copy = True`` attribute (`LeRobotReader` and `RawReader` take ``copy=True``), which `write_shards` checks
against its ``codec``.

`EpisodeData` checks what every reader hands over (names, fps, split, prompt, extra metadata, packets) when
it is made, so a custom reader gets the same refusals as the built-in ones; readers call the same checks
earlier, with the file name in the message.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from episodepipes import episode_attrs
from episodepipes.codec.stream import DECODERS, Packets
from episodepipes.errors import EpisodeError  # noqa: F401 (re-export)
from episodepipes.format import MAX_FPS, MIN_FPS, finite, fps_in_range, safe_field

# Fields a camera or array must not become once tar-safe: the per-frame ``json`` member, the batch keys
# the pipes add (pipes.builders.RESERVED) and, as any name starting with "__", webdataset's ``__key__``/``__url__``.
RESERVED_FIELDS = frozenset({"json", "episode", "frame", "timestamp", "valid", "prompt"})
ARRAY_KINDS = "biufc"  # bool, integers, floats, complex: what a .npy member and the index dtype hold exactly
Scalar = str | int | float | bool | None


def safe_names(keys: Iterable[str], where: object) -> dict[str, str]:
    """Each camera/array name -> its tar field name (`safe_field`); refuses names that would share one field
    (``wrist.left`` and ``wrist_left``, or a camera and an array both called ``state``) or take a reserved one."""
    names: dict[str, str] = {}
    by_field: dict[str, list[str]] = {}
    for k in keys:
        if not isinstance(k, str):
            raise EpisodeError(f"{where}: name {k!r} is not a string; name cameras and arrays with text")
        try:
            f = safe_field(k)
        except ValueError as e:
            raise EpisodeError(f"{where}: {e}") from e
        if f in RESERVED_FIELDS or f.startswith("__"):
            raise EpisodeError(f"{where}: name {k!r} becomes the shard field {f!r}, which is reserved "
                               f"({', '.join(sorted(RESERVED_FIELDS))} and names starting with '__'); rename it")
        names[k] = f
        by_field.setdefault(f, []).append(k)
    for f, ks in by_field.items():
        if len(ks) > 1:
            raise EpisodeError(f"{where}: names {sorted(ks)} would share the shard field {f!r}, so only one "
                               "would be kept; rename all but one")
    return names


def check_fps(fps: object, where: object) -> float:
    """A frame rate a video container stores (`format.MIN_FPS` to `format.MAX_FPS`); ``true``, strings, 0, NaN,
    Infinity and 1e308 are refused."""
    if isinstance(fps, bool) or not isinstance(fps, (int, float, np.integer, np.floating)) \
            or not finite(fps) or not fps_in_range(fps):
        raise EpisodeError(f"{where}: fps={fps!r} is not a positive, finite number of frames per second from "
                           f"{MIN_FPS} to {MAX_FPS} (what a video container stores); set it to the frame rate, e.g. 10")
    return float(fps)


def check_text(name: str, value: object, where: object, *, optional: bool = False) -> str | None:
    """``value`` when it is a string (or None with ``optional``); anything else is refused by ``name``."""
    if isinstance(value, str) or (optional and value is None):
        return value
    raise EpisodeError(f"{where}: {name}={value!r} must be a string; quote it")


def check_extra(extra: Mapping[str, object], where: object) -> dict[str, Scalar]:
    """Extra metadata, kept as is: string keys, and JSON scalars (strings, finite numbers, booleans, null)."""
    out: dict[str, Scalar] = {}
    for k, v in extra.items():
        if not isinstance(k, str):
            raise EpisodeError(f"{where}: metadata key {k!r} is not a string")
        if isinstance(v, float) and not math.isfinite(v):
            raise EpisodeError(f"{where}: metadata {k}={v!r} is not a finite number; JSON has no NaN or Infinity")
        if v is not None and not isinstance(v, (str, int, float, bool)):
            raise EpisodeError(f"{where}: metadata {k}={v!r} is a {type(v).__name__}; extra keys hold one string, "
                               "number, boolean or null each (put structured data in an array or a string)")
        out[k] = v
    return out


def check_dtype(name: str, dtype: np.dtype, where: object) -> None:
    """Refuse a dtype that shards cannot hold exactly and the pipes cannot read back: only numbers and booleans."""
    dtype = np.dtype(dtype)
    if dtype.kind not in ARRAY_KINDS or dtype.fields is not None or dtype.subdtype is not None:
        raise EpisodeError(f"{where}: array {name!r} has dtype {dtype} ({dtype.str}), which shards cannot hold; "
                           "convert it to numbers (e.g. a category index), or put text in meta.json")


def check_array(name: str, a: np.ndarray, where: object) -> np.ndarray:
    """``a``, when `check_dtype` accepts its dtype."""
    check_dtype(name, a.dtype, where)
    return a


def check_packets(packets: Mapping[str, Packets], arrays: Mapping[str, np.ndarray], where: object) -> None:
    """Copied packets: `Packets` of a codec PyAV decodes (`DECODERS`), every camera with the same number of
    frames after its ``lead`` packets (not 0), and that many steps in every array."""
    counts: dict[str, int] = {}
    for cam, p in packets.items():
        if not isinstance(p, Packets):
            raise EpisodeError(f"{where}: packets of camera {cam!r} are a {type(p).__name__}, not "
                               "episodepipes.codec.Packets; build them with copy_packets()")
        if p.codec not in DECODERS:  # Packets checks this too, unless built around its checks
            raise EpisodeError(f"{where}: camera {cam!r} holds {p.codec!r} packets, which PyAV here does not "
                               f"decode ({sorted(DECODERS)}); re-encode it with --codec av1")
        counts[cam] = len(p)
    if counts and (len(set(counts.values())) != 1 or not min(counts.values())):
        raise EpisodeError(f"{where}: copied cameras have {counts} frames (packets after the lead); every camera "
                           "needs the same number, at least 1: trim the source videos to the episode")
    steps = {k: (np.shape(a) or (0,))[0] for k, a in arrays.items()}
    n = next(iter(counts.values()), None)
    bad = {k: s for k, s in steps.items() if n is not None and s != n}
    if bad:
        raise EpisodeError(f"{where}: arrays {bad} have other step counts than the {n} frames copied from the "
                           "video; the video and the arrays must cover the same steps")


def resolve_inside(path: Path, root: Path, where: object) -> Path:
    """``path`` with its links resolved; refused when that leaves ``root`` (a resolved folder): a reader never
    opens a file outside the dataset, whatever its links say. Links that stay inside are followed."""
    real = Path(path).resolve()
    if not real.is_relative_to(root):
        raise EpisodeError(f"{where}: {path} leads to {real}, outside the source folder {root}; copy the data into "
                           "the source folder, or remove the link")
    return real


@dataclass
class EpisodeData:
    """One episode as a reader returns it; checked on construction, so every reader gets the same checks.

    Names must stay distinct once made tar-safe (``wrist.left`` and ``wrist_left`` would share a member name),
    arrays hold numbers or booleans, ``fps`` is a frame rate a video container stores, ``prompt`` and ``split``
    are text and ``extra`` holds JSON scalars; anything else is an `EpisodeError` naming the episode.

    Attributes:
        id: the episode id (any text; shard member names use a tar-safe form of it).
        cameras: camera name -> iterable of ``H x W x 3`` uint8 frames, in ``channel_order``. Iterated once,
            by the encoder, so it may be a lazy decoder.
        arrays: array name -> per-step array whose first dimension is the number of frames.
        fps: frames per second of the source; the rate overlay videos are written at.
        prompt: the language instruction ("" for none).
        split: "train", "val" or None to let the write options (or the default, train) decide.
        sources: camera/array name -> its name in the source dataset, when it had to be made tar-safe;
            recorded in the index as ``source``.
        files: camera name -> the file its frames come from, for error messages.
        channel_order: "rgb" or "bgr", of every camera's frames; a BGR decoder (OpenCV, PyAV) saves a
            conversion by saying "bgr".
        extra: further metadata of the source (raw ``meta.json`` keys, zarr attrs), JSON scalars only.
        packets: camera name -> its packets copied from a source video (``--codec copy``), one per frame after
            ``lead``; such a camera is not in ``cameras`` (it is never decoded).
    """

    id: str
    cameras: dict[str, Iterable[np.ndarray]]
    arrays: dict[str, np.ndarray]
    fps: float
    prompt: str = ""
    split: str | None = None
    # camera/array name -> the name in the source dataset, when it had to be made tar-safe
    sources: dict[str, str] = field(default_factory=dict)
    # camera name -> file it comes from, for error messages
    files: dict[str, str] = field(default_factory=dict)
    channel_order: str = "rgb"  # of every camera's frames: "rgb" or "bgr"
    # further metadata of the source (raw meta.json keys, zarr attrs), JSON scalars only
    extra: dict[str, Scalar] = field(default_factory=dict)
    # camera name -> packets copied from its source video (--codec copy), instead of frames in `cameras`
    packets: dict[str, Packets] = field(default_factory=dict)

    def __post_init__(self) -> None:
        where = f"episode {self.id!r}"
        both = sorted(set(self.cameras) & set(self.packets))
        if both:
            raise EpisodeError(f"{where}: cameras {both} have both frames and copied packets; a reader gives each "
                               "camera one or the other")
        safe_names([*self.cameras, *self.packets, *self.arrays], where)
        check_packets(self.packets, self.arrays, where)
        for k, a in self.arrays.items():
            check_array(k, np.asarray(a), where)
        self.fps = check_fps(self.fps, where)
        check_text("prompt", self.prompt, where)
        check_text("split", self.split, where, optional=True)
        self.extra = check_extra(self.extra, where)
        why = episode_attrs.problem(self.extra)  # what the index would refuse is refused here, before writing
        if why:
            raise EpisodeError(f"{where}: metadata {why}")


@runtime_checkable
class EpisodeReader(Protocol):
    """What `write_shards` reads: any picklable object with these two methods (no base class needed).

    Register a factory ``root -> reader`` with `register_format` so that `open_reader` and
    ``episodepipes-shard write --format NAME`` find it.
    """

    def episode_ids(self) -> list[str]:
        """Every episode id, in the same order on every call: jobs and resumes count episodes by position."""
        ...

    def read(self, episode_id: str) -> EpisodeData:
        """One episode; raise `EpisodeError` naming the episode and the file when its data is bad.

        Args:
            episode_id: one of `episode_ids`.
        """
        ...
