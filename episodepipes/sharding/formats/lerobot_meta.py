"""LeRobot metadata read as input from strangers: ``meta/info.json``, episode records, templates, paths.

Everything `LeRobotReader` takes from a dataset's metadata passes through here before use. A path
template may hold only LeRobot's documented placeholders (``str.format`` would otherwise read
attributes or items of its arguments, or pad to any width); every file the reader opens resolves
inside the dataset root, through symlinks too; numbers that index, seek or size are typed, finite
and bounded. Each refusal is one line naming the file, the field and the fix.
"""

from __future__ import annotations

import json
import re
import string
from dataclasses import dataclass
from pathlib import Path

from episodepipes.format import MAX_FPS, MIN_FPS, finite, fps_in_range

V3 = "v3.0"
LEGACY = ("v2.0", "v2.1")
MAX_INDEX = 2**31  # episode/chunk/file indices and lengths; LeRobot's own are far below
MAX_INFO_BYTES = 16 * 2**20  # a real info.json is a few kB
MAX_JSONL_BYTES = 2**30  # episodes.jsonl, tasks.jsonl: a few hundred bytes a line, far below this at 10**6 episodes
PLACEHOLDERS = {V3: {"data_path": ("chunk_index", "file_index"),
                     "video_path": ("video_key", "chunk_index", "file_index")},
                "legacy": {"data_path": ("episode_chunk", "episode_index"),
                           "video_path": ("video_key", "episode_chunk", "episode_index")}}
_INT_SPEC = re.compile(r"(0?[1-9]\d?)?d?")  # "", "d", "03d", "06d": a width of 99 at most


@dataclass(frozen=True)
class Episode:
    """One episode's record from ``meta/episodes``, with its files as paths relative to the root."""

    index: int
    length: int
    tasks: tuple[str, ...]
    data_file: str
    videos: dict[str, tuple[str, float, float | None]]  # key -> (relative mp4, from_ts, to_ts)


def relative(rel: object, what: str, error: type[ValueError] = ValueError) -> str:
    """``rel`` if it is a relative path that cannot climb out of its folder; checks the text only."""
    if not isinstance(rel, str) or not rel or "\0" in rel or Path(rel).is_absolute() or ".." in Path(rel).parts:
        raise error(f"{what}: path {_short(rel, 300)} must be relative to the dataset root, without '..'; fix the "
                    "metadata that names it (a dataset never reads files outside its folder)")
    return rel


def inside(root: Path, rel: object, what: str, error: type[ValueError] = ValueError) -> Path:
    """``root / rel`` resolved (``root`` is already resolved); refused unless it stays inside ``root``."""
    real = (root / relative(rel, what, error)).resolve()
    if not real.is_relative_to(root):
        raise error(f"{what}: {rel!r} resolves to {real}, outside the dataset root {root} (a symlink leaving it); "
                    "replace the link by the file itself (cp -L), or download the dataset with real files")
    return real


def regular_file(real: Path, what: str, error: type[ValueError] = ValueError) -> Path:
    """``real`` if it is a regular file (not a folder, a device such as /dev/zero, or a FIFO)."""
    if real.exists() and not real.is_file():
        raise error(f"{what}: {real} is not a regular file; replace it by the file the dataset should hold")
    return real


def read_json(path: Path, shown: Path, *, max_bytes: int = MAX_INFO_BYTES) -> object:
    """The JSON value in ``path`` (shown as ``shown``); any reason it cannot be read names the file."""
    return loads(read_bounded(path, shown, max_bytes=max_bytes), str(shown))


def read_bounded(path: Path, shown: Path, *, max_bytes: int = MAX_JSONL_BYTES,
                 error: type[ValueError] = ValueError) -> bytes:
    """The bytes of metadata file ``path`` (shown as ``shown``), refused by its size before any is read: a sparse
    file costs no disk and would be read whole."""
    size = path.stat().st_size
    if size > max_bytes:
        raise error(f"{shown}: {size} bytes is too large for LeRobot metadata (at most {max_bytes}); "
                    "re-download the dataset's meta/")
    return path.read_bytes()


def loads(data: bytes | str, where: str) -> object:
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError(f"{where}: JSON nested too deeply to read; re-download or regenerate it") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, an integer of too many digits
        raise ValueError(f"{where}: invalid JSON ({e}); re-download or regenerate it") from None


def check_info(info: object, where: str) -> tuple[str, float, dict[str, dict]]:
    """(version, fps, features) of a parsed info.json, or a ValueError naming the field."""
    if not isinstance(info, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(info).__name__}; re-download meta/info.json")
    version = info.get("codebase_version")
    if version not in (V3, *LEGACY):
        raise ValueError(f"{where}: codebase_version={version!r} is not supported; this reader reads "
                         f"{V3} and {', '.join(LEGACY)}; convert the dataset with LeRobot's converter to {V3}")
    return version, fps(info.get("fps"), where), features(info.get("features"), where)


def fps(value: object, where: str) -> float:
    if type(value) not in (int, float) or not finite(value) or not fps_in_range(value):
        raise ValueError(f"{where}: fps={value!r} must be a finite number > 0 (frames per second) from {MIN_FPS} "
                         f"to {MAX_FPS}, what a video container stores; fix meta/info.json")
    return float(value)


def features(feats: object, where: str) -> dict[str, dict]:
    if not isinstance(feats, dict) or not feats:
        raise ValueError(f"{where}: features={_short(feats)} must be a non-empty object of feature name -> "
                         "{dtype, shape}; fix meta/info.json")
    for key, f in feats.items():
        if not isinstance(f, dict) or not isinstance(f.get("dtype"), str):
            raise ValueError(f"{where}: features[{key!r}]={_short(f)} must be an object with a string 'dtype' "
                             "(video, image, float32, ...); fix meta/info.json")
        shape = f.get("shape")
        if shape is not None and (not isinstance(shape, list) or len(shape) > 32
                                  or any(type(d) is not int or not 0 <= d < MAX_INDEX for d in shape)):
            raise ValueError(f"{where}: features[{key!r}].shape={_short(shape)} must be a list of at most 32 "
                             f"integers in [0, {MAX_INDEX}); fix meta/info.json")
    return feats


def template(info: dict, field: str, version: str, where: str) -> str:
    """``info[field]``, a path template that uses only the documented placeholders of ``version``."""
    allowed = PLACEHOLDERS[V3 if version == V3 else "legacy"][field]
    t = info.get(field)
    if not isinstance(t, str) or not t:
        raise ValueError(f"{where}: {field}={_short(t)} must be a path template string with the placeholders "
                         f"{{{'}, {'.join(allowed)}}}; fix meta/info.json or re-convert the dataset")
    try:
        parts = list(string.Formatter().parse(t))
    except ValueError as e:
        raise ValueError(f"{where}: {field}={t!r} is not a valid template ({e}); fix meta/info.json") from None
    for _, name, spec, conversion in parts:
        if name is None:
            continue
        if name not in allowed:
            raise ValueError(f"{where}: {field}={t!r} uses {{{name}}}; only {{{'}, {'.join(allowed)}}} are allowed "
                             "(no attribute or item access); fix meta/info.json")
        if conversion is not None or not (spec == "" if name == "video_key" else _INT_SPEC.fullmatch(spec)):
            raise ValueError(f"{where}: {field}={t!r}: {{{name}}} may take no conversion and at most a width such "
                             f"as {{{name}:03d}}; fix meta/info.json")
    return t


def index(value: object, name: str, where: str, *, low: int = 0) -> int:
    if type(value) is not int or not low <= value < MAX_INDEX:
        raise ValueError(f"{where}: {name}={value!r} must be an integer in [{low}, {MAX_INDEX}); "
                         "fix the episode metadata or re-convert the dataset")
    return value


def seconds(value: object, name: str, where: str) -> float:
    if type(value) not in (int, float) or not finite(value) or value < 0:
        raise ValueError(f"{where}: {name}={value!r} must be a finite number of seconds >= 0; "
                         "fix the episode metadata or re-convert the dataset")
    return float(value)


def tasks(value: object, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list | tuple) or not all(isinstance(t, str | None) for t in value):
        raise ValueError(f"{where}: tasks={_short(value)} must be a list of strings; fix the episode metadata")
    return tuple(t for t in value if t is not None)


def tolerance(value: object) -> float:
    if type(value) not in (int, float) or not finite(value) or value <= 0:
        raise ValueError(f"tolerance_s={value!r} must be a finite number of seconds > 0 (--tolerance-s of "
                         "`episodepipes-shard write`); LeRobot's default is 1e-4")
    return float(value)


def unique(episodes: list[Episode], where: str) -> dict[int, Episode]:
    out: dict[int, Episode] = {}
    for e in episodes:
        if e.index in out:
            raise ValueError(f"{where}: episode_index {e.index} is listed twice; the metadata is inconsistent, "
                             "re-download or re-convert the dataset")
        out[e.index] = e
    return out


def check_total(info: dict, listed: int, where: str) -> None:
    """info.json's ``total_episodes`` equals the episodes the metadata lists: LeRobot takes ``range(total_episodes)``
    as the episodes of a v2 dataset and counts the episodes by it, so a mismatch means files lost or added since it
    was written (an absent count is left alone, as LeRobot's own writer always gives one)."""
    total = info.get("total_episodes", listed)
    if type(total) is not int or total != listed:
        raise ValueError(f"{where}: total_episodes={_short(total)} but the episode metadata lists {listed} episodes; "
                         "the metadata is inconsistent, re-download or re-convert the dataset")


def _short(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."
