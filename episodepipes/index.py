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
from typing import TYPE_CHECKING

import numpy as np

from episodepipes._indexcheck import IndexFormatError, check_index
from episodepipes.format import FORMAT_NAME, FORMAT_VERSION, INDEX_NAME
from episodepipes.shardio import ByteSource, ShardMissingError, is_url, open_source

if TYPE_CHECKING:
    from episodepipes.remote import RemoteOptions

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
    """A shard folder's index. Use `EpisodeIndex.open(path)` (a folder, or an ``s3://``/``gs://``/``http(s)://`` root).

    Attributes:
        root: the shard folder (a `Path`), or the remote root URL (a `str`, without a trailing slash).
        source: the byte source every shard of this index is read through (the pipes use it).
    """

    def __init__(self, root: Path, data: dict, fingerprint: str = "") -> None:
        """``data`` is checked field by field (`check_index`) before any of it is used.

        Args:
            root: the shard folder; shard names in ``data`` are plain file names inside it.
            data: the parsed ``index.json``.
            fingerprint: the sha256 of the index file's bytes (`open` gives it).
        """
        self._load(Path(root), data, fingerprint, Path(root) / INDEX_NAME)

    def _load(self, root: Path | str, data: dict, fingerprint: str, file: Path | str) -> None:
        _validate(data, file)  # ``file`` is what the messages name
        self.root = root
        self._source: ByteSource | None = None
        self.data = data
        self.fingerprint = fingerprint  # sha256 of the index file's bytes: resume state checks it is the same index
        self.shards: list[Shard] = [Shard(**s) for s in data["shards"]]
        self.episodes: list[Episode] = [_episode(e) for e in data["episodes"]]
        self._by_id = {e.id: e for e in self.episodes}
        self._by_shard: dict[int, list[tuple[Episode, Segment]]] | None = None

    @classmethod
    def open(cls, path: str | os.PathLike, *, verify: bool = False,
             options: RemoteOptions | None = None) -> EpisodeIndex:
        """Read and validate ``<path>/index.json`` (``path`` may also be the json file itself).

        Args:
            path: a shard folder, or a remote root (``s3://bucket/prefix``, ``gs://...``, ``https://host/prefix``)
                whose ``index.json`` is read through its byte source and validated exactly as a local one.
            verify: check every shard's size, sha256 and frame checksums now (a remote root downloads them).
            options: how a remote root is read (`episodepipes.remote.RemoteOptions`); a local folder ignores them.
        """
        if is_url(path):
            return cls._open_remote(str(path), verify=verify, options=options)
        p = Path(str(path).removeprefix("file://"))
        root, file = (p.parent, p) if p.suffix == ".json" else (p, p / INDEX_NAME)
        if not file.exists():
            hint = ("an unfinished write: re-run the same write command to resume it" if root.is_dir()
                    else "the folder does not exist; check the path")
            raise FileNotFoundError(f"no {INDEX_NAME} in {root}: {hint}")
        raw = file.read_bytes()
        index = cls.__new__(cls)
        index._load(root, _parse(raw, file), hashlib.sha256(raw).hexdigest(), file)
        if verify:
            index.verify()
        return index

    @classmethod
    def _open_remote(cls, url: str, *, verify: bool, options: RemoteOptions | None) -> EpisodeIndex:
        source = open_source(url, options=options)  # refuses a root with credentials without echoing it
        file = f"{source.root}/{INDEX_NAME}"
        try:
            raw = source.read_file(INDEX_NAME)
        except ShardMissingError:
            raise FileNotFoundError(f"no {INDEX_NAME} at {source.root}: an unfinished upload or write, or the "
                                    "wrong prefix; check the URL") from None
        index = cls.__new__(cls)
        index._load(source.root, _parse(raw, file), hashlib.sha256(raw).hexdigest(), file)
        index._source = source
        if verify:
            index.verify()
        return index

    @property
    def remote(self) -> bool:
        """Whether the shards live under a remote root (read through `source`, never as local files)."""
        return isinstance(self.root, str)

    @property
    def source(self) -> ByteSource:
        """The byte source of this index's root, opened on first use (opening connects to nothing)."""
        if self._source is None:
            self._source = open_source(self.root)
        return self._source

    def location(self, name: str) -> str:
        """Where the file ``name`` of this dataset is, for messages (a path, or the object's URL).

        Args:
            name: a file name inside the root (a shard's, or ``index.json``).
        """
        return f"{self.root}/{name}" if self.remote else str(Path(self.root) / name)

    def episode(self, episode_id: str) -> Episode:
        try:
            return self._by_id[episode_id]
        except KeyError:
            import difflib

            close = difflib.get_close_matches(str(episode_id), list(self._by_id), n=5, cutoff=0.5)
            raise KeyError(
                f"episode {episode_id!r} is not in {self.location(INDEX_NAME)}; close matches: {close or 'none'}"
            ) from None

    def split(self, split: str) -> list[Episode]:
        return [e for e in self.episodes if e.split == split]

    def shard_path(self, shard: int) -> Path:
        """The local file of a shard; a remote index has none (read it through `source`)."""
        if self.remote:
            raise ValueError(f"{self.root} is a remote root: its shards have no local path; read them through "
                             "index.source")
        return Path(self.root) / self.shards[shard].name

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
            s, p = self.shards[i], self.location(self.shards[i].name)
            size = self.shard_size(i)
            if size is None:
                raise FileNotFoundError(f"shard {p} is missing; restore it or re-shard")
            if size != s.bytes:
                raise IndexFormatError(f"shard {p} has {size} bytes, index says {s.bytes}: truncated? re-shard it")
            with self.shard_bytes(i) as view:
                sha, bad = hashlib.sha256(view).hexdigest(), self.bad_frames(i, view)
            where = f" ({len(bad)} damaged frames, the first episode {bad[0][0]!r} frame {bad[0][1]})" if bad else ""
            if sha != s.sha256:
                raise IndexFormatError(f"shard {p}: sha256 mismatch with the index{where}; the file changed, "
                                       "re-shard it")
            if bad:
                raise IndexFormatError(f"shard {p}: crc32 mismatch{where}; restore the shard or re-shard")

    def shard_size(self, shard: int) -> int | None:
        """A shard file's size in bytes, or None if it is missing.

        Args:
            shard: a shard number, an index into `shards`.
        """
        if not self.remote:
            p = self.shard_path(shard)
            return p.stat().st_size if p.exists() else None
        try:
            return self.source.size(self.shards[shard].name)
        except ShardMissingError:
            return None

    @contextlib.contextmanager
    def shard_bytes(self, shard: int) -> Iterator[memoryview]:
        """A shard's whole bytes: memory-mapped from a local folder, downloaded (one GET) from a remote root.

        Args:
            shard: a shard number, an index into `shards`.
        """
        if not self.remote:
            with mapped(self.shard_path(shard)) as view:
                yield view
            return
        name = self.shards[shard].name
        with memoryview(self.source.read(name, 0, self.shard_size(shard) or 0)) as view:
            yield view


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


def _parse(raw: bytes, file: Path | str) -> object:
    """The JSON in an index file's bytes; an `IndexFormatError` naming ``file`` if it is not JSON."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise IndexFormatError(f"{file}: nested too deeply to be an index; re-shard with --overwrite") from None
    except ValueError as e:  # JSONDecodeError, or bytes that are not UTF-8
        raise IndexFormatError(f"{file}: not valid JSON ({e}); re-shard with --overwrite") from None


def _validate(data: object, file: Path | str) -> None:
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
