"""`EpisodeIndex`: the validated, read-only view of a shard folder's ``index.json``.

Every length, plan and byte range in the pipes is computed from this object alone, so nothing
here touches a shard unless asked to (``verify=True``). It imports no torch, so the sharding CLI
(``info``, ``verify``, ``merge``) reads indexes through it too.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from episodepipes.format import FORMAT_NAME, FORMAT_VERSION, INDEX_NAME


class IndexFormatError(ValueError):
    """An index that cannot be used; the message names the file, the field and the fix."""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


@dataclass(frozen=True)
class Camera:
    """A camera's stored frame size, and its size in the source before ``--resize`` (to rescale pixel labels)."""

    name: str
    height: int
    width: int
    source: str
    source_height: int
    source_width: int


@dataclass(frozen=True)
class ArraySpec:
    """``dtype`` is numpy's full ``dtype.str`` (``"<f4"``, ``">f4"``, ``"|u1"``): byte order included."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    source: str


@dataclass(frozen=True)
class Segment:
    """The run of an episode's frames that lives in one shard."""

    shard: int
    first: int
    count: int
    offsets: tuple[int, ...]
    end: int
    crc32: tuple[int, ...] | None = None  # zlib.crc32 of each frame's bytes; None in indexes written before them

    @property
    def start(self) -> int:
        return self.offsets[0]


@dataclass(frozen=True)
class Shard:
    name: str
    bytes: int
    sha256: str
    samples: int


@dataclass(frozen=True)
class Episode:
    id: str
    split: str
    length: int
    fps: float
    prompt: str
    cameras: dict[str, Camera]
    arrays: dict[str, ArraySpec]
    segments: tuple[Segment, ...] = field(repr=False)

    def frame_range(self, frame: int) -> tuple[int, int, int]:
        """(shard index, start byte, end byte) of one frame's members."""
        if not 0 <= frame < self.length:
            raise IndexError(f"frame {frame} is outside episode {self.id!r} of length {self.length}")
        firsts = [s.first for s in self.segments]
        seg = self.segments[bisect.bisect_right(firsts, frame) - 1]
        k = frame - seg.first
        end = seg.offsets[k + 1] if k + 1 < seg.count else seg.end
        return seg.shard, seg.offsets[k], end

    def frame_crc(self, frame: int) -> int | None:
        """``zlib.crc32`` of the bytes `frame_range` gives, or None when the index has no checksums."""
        if not 0 <= frame < self.length:
            raise IndexError(f"frame {frame} is outside episode {self.id!r} of length {self.length}")
        firsts = [s.first for s in self.segments]
        seg = self.segments[bisect.bisect_right(firsts, frame) - 1]
        return None if seg.crc32 is None else seg.crc32[frame - seg.first]

    @property
    def nbytes(self) -> int:
        return sum(s.end - s.start for s in self.segments)


def _need(d: dict, key: str, where: str, path: Path) -> Any:
    if key not in d:
        raise IndexFormatError(f"{path} is damaged: {where} has no {key!r}; re-shard with write --overwrite")
    return d[key]


class EpisodeIndex:
    """A shard folder's index. Use `EpisodeIndex.open(path)`."""

    def __init__(self, root: Path, data: dict, fingerprint: str = "") -> None:
        self.root = Path(root)
        self.data = data
        self.fingerprint = fingerprint  # sha256 of the index file's bytes: resume state checks it is the same index
        self.shards: list[Shard] = [Shard(**s) for s in data["shards"]]
        self.episodes: list[Episode] = [_episode(e) for e in data["episodes"]]
        self._by_id = {e.id: e for e in self.episodes}

    @classmethod
    def open(cls, path: str | os.PathLike, *, verify: bool = False) -> EpisodeIndex:
        """Read and validate ``<path>/index.json`` (``path`` may also be the json file itself)."""
        p = Path(path)
        root, file = (p.parent, p) if p.suffix == ".json" else (p, p / INDEX_NAME)
        if not file.exists():
            hint = ("an unfinished write: re-run the same write command to resume it" if root.is_dir()
                    else "the folder does not exist; check the path")
            raise FileNotFoundError(f"no {INDEX_NAME} in {root}: {hint}")
        raw = file.read_bytes()
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as e:
            raise IndexFormatError(f"{file}: not valid JSON ({e}); re-shard with --overwrite") from e
        try:
            _validate(data, file)
            index = cls(root, data, hashlib.sha256(raw).hexdigest())
        except IndexFormatError:
            raise
        except (KeyError, TypeError, AttributeError, ValueError) as e:  # a field of the wrong shape or type
            raise IndexFormatError(f"{file} is damaged ({type(e).__name__}: {e}); "
                                   "re-shard with write --overwrite") from e
        if verify:
            index.verify()
        return index

    def episode(self, episode_id: str) -> Episode:
        try:
            return self._by_id[episode_id]
        except KeyError:
            import difflib

            close = difflib.get_close_matches(str(episode_id), list(self._by_id), n=5, cutoff=0.5)
            raise KeyError(
                f"episode {episode_id!r} is not in {self.root / INDEX_NAME}; close matches: {close or 'none'}"
            ) from None

    def split(self, split: str) -> list[Episode]:
        return [e for e in self.episodes if e.split == split]

    def shard_path(self, shard: int) -> Path:
        return self.root / self.shards[shard].name

    def verify(self, shards: Iterable[int] | None = None) -> None:
        """Check existence, size and sha256 of the given shards (all by default), naming the first bad one."""
        for i in range(len(self.shards)) if shards is None else sorted(set(shards)):
            s, p = self.shards[i], self.shard_path(i)
            if not p.exists():
                raise FileNotFoundError(f"shard {p} is missing; restore it or re-shard")
            size = p.stat().st_size
            if size != s.bytes:
                raise IndexFormatError(f"shard {p} has {size} bytes, index says {s.bytes}: truncated? re-shard it")
            if sha256_file(p) != s.sha256:
                raise IndexFormatError(f"shard {p}: sha256 mismatch with the index; the file changed, re-shard it")


def _camera(n: str, c: dict) -> Camera:
    h, w = int(c["height"]), int(c["width"])
    return Camera(n, h, w, c.get("source", n), int(c.get("source_height", h)), int(c.get("source_width", w)))


def _dtype(name: str) -> str:
    dt = np.dtype(name)
    if dt.hasobject or dt.kind in "OVT":
        raise ValueError(f"dtype {name!r} cannot be stored exactly in .npy without pickle")
    return dt.str


def _episode(e: dict) -> Episode:
    cams = {n: _camera(n, c) for n, c in e["cameras"].items()}
    arrs = {
        n: ArraySpec(n, _dtype(a["dtype"]), tuple(a["shape"]), a.get("source", n)) for n, a in e["arrays"].items()
    }
    segs = tuple(
        Segment(s["shard"], s["first"], s["count"], tuple(s["offsets"]), s["end"],
                tuple(s["crc32"]) if "crc32" in s else None) for s in e["segments"]
    )
    return Episode(e["id"], e["split"], int(e["length"]), float(e["fps"]), e.get("prompt", ""), cams, arrs, segs)


def _validate(data: dict, file: Path) -> None:
    if not isinstance(data, dict) or data.get("format") != FORMAT_NAME:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise IndexFormatError(f"{file}: not an episodepipes shard index (format={found!r})")
    version = data.get("version")
    if version != FORMAT_VERSION:
        raise IndexFormatError(
            f"{file}: index version {version!r}, this episodepipes reads version {FORMAT_VERSION}; "
            "re-shard with this version's scripts/shard.py write --overwrite, or install the matching episodepipes"
        )
    shards = _need(data, "shards", "the index", file)
    for i, s in enumerate(shards):
        for k in ("name", "bytes", "sha256", "samples"):
            _need(s, k, f"shard {i}", file)
    for e in _need(data, "episodes", "the index", file):
        where = f"episode {e.get('id', '?')!r}"
        for k in ("id", "split", "length", "fps", "cameras", "arrays", "segments"):
            _need(e, k, where, file)
        for k, s in enumerate(e["segments"]):
            for key in ("shard", "first", "count", "offsets", "end"):
                _need(s, key, f"{where} segment {k}", file)
            if not 0 <= s["shard"] < len(shards) or len(s["offsets"]) != s["count"]:
                raise IndexFormatError(f"{file}: {where}: a segment points outside the shard list or is malformed")
        if sum(s["count"] for s in e["segments"]) != e["length"]:
            raise IndexFormatError(f"{file}: {where}: segments hold a different frame count than length={e['length']}")
