"""`EpisodeIndex`: the validated, read-only view of a shard folder's ``index.json``.

Every length, plan and byte range in the pipes is computed from this object alone, so nothing
here touches a shard unless asked to (``verify=True``). It imports no torch, so the sharding CLI
(``info``, ``verify``, ``merge``) reads indexes through it too.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import hashlib
import json
import mmap
import os
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from episodepipes._indexcheck import IndexFormatError, check_index
from episodepipes.format import FORMAT_NAME, FORMAT_VERSION, INDEX_NAME
from episodepipes.normstats import StatsTable
from episodepipes.statsfields import check_counts, no_stats_hint
from episodepipes.statsfields import load as load_stats

__all__ = ["ArraySpec", "Camera", "Episode", "EpisodeIndex", "IndexFormatError", "Segment", "Shard", "sha256_file"]


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


class EpisodeIndex:
    """A shard folder's index. Use `EpisodeIndex.open(path)`."""

    def __init__(self, root: Path, data: dict, fingerprint: str = "") -> None:
        """``data`` is checked field by field (`check_index`) before any of it is used.

        Args:
            root: the shard folder; shard names in ``data`` are plain file names inside it.
            data: the parsed ``index.json``.
            fingerprint: the sha256 of the index file's bytes (`open` gives it).
        """
        self._load(Path(root), data, fingerprint, Path(root) / INDEX_NAME)

    def _load(self, root: Path, data: dict, fingerprint: str, file: Path) -> None:
        _validate(data, file)  # ``file`` is what the messages name
        self.root = root
        self.data = data
        self.fingerprint = fingerprint  # sha256 of the index file's bytes: resume state checks it is the same index
        self.shards: list[Shard] = [Shard(**s) for s in data["shards"]]
        self.episodes: list[Episode] = [_episode(e) for e in data["episodes"]]
        self._by_id = {e.id: e for e in self.episodes}
        self._by_shard: dict[int, list[tuple[Episode, Segment]]] | None = None
        self._stats, self._stats_missing = _load_stats(data, file)
        self._file = file

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
        except RecursionError:
            raise IndexFormatError(f"{file}: nested too deeply to be an index; re-shard with --overwrite") from None
        except ValueError as e:  # JSONDecodeError, or bytes that are not UTF-8
            raise IndexFormatError(f"{file}: not valid JSON ({e}); re-shard with --overwrite") from None
        index = cls.__new__(cls)
        index._load(root, data, hashlib.sha256(raw).hexdigest(), file)
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

    def stats(self, key: str, split: str = "train") -> dict[str, Any]:
        """Normalization statistics of array ``key`` over ``split``: ``count`` and float64 arrays of the step
        shape: ``mean``, ``std`` (ddof=0), ``min``, ``max``, ``q01``, ``q10``, ``q50``, ``q90``, ``q99``.

        Computed by the writer over every episode of the split (exactly: merged jobs give the same numbers;
        quantiles within `episodepipes.normstats.REL_ERROR`). Pass the result to `Normalize.from_stats`.
        """
        if self._stats is None:
            raise KeyError(no_stats_hint(self._file))
        if (split, key) in self._stats_missing:
            raise KeyError(f"{self._file} has no statistics for {key!r} in split {split!r}: "
                           f"{self._stats_missing[(split, key)]}")
        if (split, key) not in self._stats.keys():
            have = sorted(f"{s}/{k}" for s, k in self._stats.keys() if (s, k) not in self._stats_missing)
            raise KeyError(f"{self._file} has no statistics for {key!r} in split {split!r}; it has {have}")
        return self._stats.get(key, split=split).summary()

    def split(self, split: str) -> list[Episode]:
        return [e for e in self.episodes if e.split == split]

    def shard_path(self, shard: int) -> Path:
        return self.root / self.shards[shard].name

    def segments_in(self, shard: int) -> list[tuple[Episode, Segment]]:
        """Every (episode, segment) whose frames are in ``shard``, in index order.

        Args:
            shard: a shard number, an index into `shards`.
        """
        if self._by_shard is None:
            self._by_shard = {}
            for e in self.episodes:
                for seg in e.segments:
                    self._by_shard.setdefault(seg.shard, []).append((e, seg))
        return self._by_shard.get(shard, [])

    def bad_frames(self, shard: int, data: bytes | memoryview) -> list[tuple[str, int]]:
        """(episode id, frame) of every frame of ``shard`` whose bytes in ``data`` fail the index's crc32.

        Args:
            shard: a shard number, an index into `shards`.
            data: that shard file's bytes (e.g. `mapped`), sliced at each frame's byte range.
        """
        out = []
        for e, seg in self.segments_in(shard):
            for k, (a, b, crc) in enumerate(zip(seg.offsets, (*seg.offsets[1:], seg.end), seg.crc32 or ())):
                if zlib.crc32(data[a:b]) != crc:
                    out.append((e.id, seg.first + k))
        return out

    def verify(self, shards: Iterable[int] | None = None) -> None:
        """Check existence, size, sha256 and every frame's crc32 of the given shards (all by default),
        naming the first bad shard, and its first damaged frame where the index has checksums."""
        for i in range(len(self.shards)) if shards is None else sorted(set(shards)):
            s, p = self.shards[i], self.shard_path(i)
            if not p.exists():
                raise FileNotFoundError(f"shard {p} is missing; restore it or re-shard")
            size = p.stat().st_size
            if size != s.bytes:
                raise IndexFormatError(f"shard {p} has {size} bytes, index says {s.bytes}: truncated? re-shard it")
            with mapped(p) as view:
                sha, bad = hashlib.sha256(view).hexdigest(), self.bad_frames(i, view)
            where = f" ({len(bad)} damaged frames, the first episode {bad[0][0]!r} frame {bad[0][1]})" if bad else ""
            if sha != s.sha256:
                raise IndexFormatError(f"shard {p}: sha256 mismatch with the index{where}; the file changed, "
                                       "re-shard it")
            if bad:
                raise IndexFormatError(f"shard {p}: crc32 mismatch{where}; restore the shard or re-shard")


@contextlib.contextmanager
def mapped(path: Path) -> Iterator[memoryview]:
    """A file's bytes, memory-mapped: sha256 and per-frame crc32 slices read it once, without copies."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            yield memoryview(b"")
            return
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm, memoryview(mm) as view:
            yield view


def _camera(n: str, c: dict) -> Camera:
    h, w = c["height"], c["width"]
    return Camera(n, h, w, c.get("source", n), c.get("source_height", h), c.get("source_width", w))


@functools.lru_cache(maxsize=256)
def _dtype_str(text: str) -> str:
    return np.dtype(text).str


def _episode(e: dict) -> Episode:
    cams = {n: _camera(n, c) for n, c in e["cameras"].items()}
    arrs = {n: ArraySpec(n, _dtype_str(a["dtype"]), tuple(a["shape"]), a.get("source", n))
            for n, a in e["arrays"].items()}
    segs = tuple(Segment(s["shard"], s["first"], s["count"], tuple(s["offsets"]), s["end"],
                         tuple(s["crc32"]) if "crc32" in s else None) for s in e["segments"])
    return Episode(e["id"], e["split"], e["length"], float(e["fps"]), e.get("prompt", ""), cams, arrs, segs)


def _load_stats(data: dict, file: Path) -> tuple[StatsTable | None, dict[tuple[str, str], str]]:
    """The index's statistics, checked field by field and against its episodes' step counts."""
    try:
        table, missing = load_stats(data, where=str(file))
        if table is not None:
            check_counts(table, missing, data["episodes"], str(file))
    except ValueError as e:
        raise IndexFormatError(f"{e}; recompute them: episodepipes-shard stats {file.parent} --recompute") from None
    return table, missing


def _validate(data: object, file: Path) -> None:
    if not isinstance(data, dict) or data.get("format") != FORMAT_NAME:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise IndexFormatError(f"{file}: not an episodepipes shard index (format={found!r})")
    version = data.get("version")
    if version != FORMAT_VERSION or type(version) is not int:
        raise IndexFormatError(
            f"{file}: index version {version!r}, this episodepipes reads version {FORMAT_VERSION}; "
            "re-shard with this version's scripts/shard.py write --overwrite, or install the matching episodepipes"
        )
    check_index(data, file)
