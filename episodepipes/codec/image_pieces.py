"""Image frames in a ``--codec reference`` index: each frame's bytes as pieces of the files they lie in, and the
table of image files, one per frame where a camera is a folder of image files.

`reference_layout.layout` lays an image camera out as a video camera whose packets are its frames, each at a
*placeholder* file number (`placeholder`, below the literal and rows files'): `remap` puts each frame's own pieces in
its place (one piece of an image file, or the few byte ranges of a parquet file its bytes sit in,
`parquet_pages`). The image files are too many for the index's JSON list of source files, so they are a binary
table (`ImageFiles`, ``reference.images.bin``: each file's size, the CRC32s of its ends and its name), numbered
after the JSON's files (`IMAGE_BASE` while the writer does not yet know how many those are), and checked on open
like every column: its dtypes, counts and ranges, and every name relative and plain (`reference.check_file`'s
rule).
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from episodepipes.codec.reference import FileInfo, stamp
from episodepipes.codec.reference_blocks import inflated
from episodepipes.codec.reference_layout import ROWS, CameraPackets, EpisodeLayout

IMAGE_BASE = 1 << 30  # image file numbers while writing (renumbered after the JSON's files by `renumber`)
MAGIC = b"EPIMG1\n\0"
_PART = rb"[A-Za-z0-9_][A-Za-z0-9_.\-=]{0,254}"
_NAMES = re.compile(rb"(?:%s(?:/%s){0,15}\n)*" % (_PART, _PART))  # reference.MAX_DEPTH parts a name


def placeholder(camera: int) -> int:
    """The file number an episode's image camera ``camera`` is laid out at (never a real file's)."""
    return ROWS - 1 - camera


@dataclass
class ImageFrames:
    """One image camera of an episode: each frame's pieces (``first[t]:first[t + 1]`` of ``file``, ``at``,
    ``size``), its (height, width) and its bytes, back to back (``offsets`` each frame's start)."""

    first: np.ndarray
    file: np.ndarray
    at: np.ndarray
    size: np.ndarray
    data: bytes
    offsets: np.ndarray
    height: int
    width: int

    def packets(self, camera: int) -> CameraPackets:
        """The frames as `reference_layout` lays out a camera's packets, at camera ``camera``'s placeholder."""
        size = np.diff(np.append(self.offsets, len(self.data)))
        return CameraPackets(placeholder(camera), self.offsets, size, memoryview(self.data), 0)

    def meta(self, source: str) -> dict:
        """The camera's index fields, as the copy import writes an image camera's (no codec: JPEG or PNG)."""
        return {"height": self.height, "width": self.width, "source": source, "source_height": self.height,
                "source_width": self.width}


def remap(lay: EpisodeLayout, cameras: dict[int, ImageFrames]) -> EpisodeLayout:
    """``lay`` with each image frame's placeholder piece replaced by the frame's own pieces."""
    if not cameras:
        return lay
    start, file, at = lay.start, lay.file, lay.at
    counts = np.ones(len(file), np.int64)
    frame = np.zeros(len(file), np.int64)
    for ph, cam in cameras.items():
        k = np.flatnonzero(file == ph)
        t = np.searchsorted(cam.offsets, at[k], side="right") - 1
        if (cam.offsets[t] != at[k]).any():
            raise AssertionError("an image piece does not start at its frame")
        frame[k] = t
        counts[k] = np.diff(cam.first)[t]
    rep = np.repeat(np.arange(len(file)), counts)
    new_start, new_file, new_at = start[rep].copy(), file[rep].copy(), at[rep].copy()
    into = np.cumsum(counts) - counts  # each old piece's first new one
    for ph, cam in cameras.items():
        k = np.flatnonzero(file == ph)
        t = frame[k]
        n = np.diff(cam.first)[t]
        dst = np.repeat(into[k], n) + _ranks(n)
        src = np.repeat(cam.first[t], n) + _ranks(n)
        sizes = cam.size[src]
        new_file[dst], new_at[dst] = cam.file[src], cam.at[src]
        new_start[dst] = np.repeat(start[k], n) + _ranks_sum(sizes, n)
    if (new_file < ROWS).any():
        raise AssertionError("an image piece was left at its placeholder")
    return replace(lay, start=new_start, file=new_file, at=new_at)


def _ranks(n: np.ndarray) -> np.ndarray:
    """0..n[k]-1 for each k, back to back."""
    return np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)


def _ranks_sum(size: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Each piece's offset inside its group (the sizes before it in its group)."""
    run = np.cumsum(size) - size
    return run - np.repeat(run[np.cumsum(n) - n], n) if len(size) else run


class ImageFiles:
    """The image files of an index, as the writer adds them (`add`) or an index holds them (`decode`)."""

    def __init__(self) -> None:
        self._rows: list[FileInfo] = []
        self._numbers: dict[str, int] = {}
        self.sizes = np.zeros(0, np.int64)
        self._names = b""
        self._ends = np.zeros(0, np.int64)
        self._head = self._tail = np.zeros(0, np.int64)

    def add(self, name: str, data: bytes | memoryview) -> int:
        """The number (from `IMAGE_BASE`) of the image file ``name`` (relative to the root), whose bytes are
        ``data``; a name added before keeps its number."""
        k = self._numbers.get(name)
        if k is None:
            k = self._numbers[name] = len(self._rows)
            self._rows.append(FileInfo(name, len(data), *stamp(lambda o, n: data[o:o + n], len(data))))
        return IMAGE_BASE + k

    @classmethod
    def of(cls, rows: Sequence[FileInfo]) -> ImageFiles:
        """A table of these rows as they are (unchecked: `decode` checks what `encode` wrote)."""
        out = cls()
        out._rows = list(rows)
        return out

    @property
    def bytes(self) -> int:
        return sum(f.bytes for f in self._rows)

    def __len__(self) -> int:
        return len(self._rows) if self._rows else len(self._ends)

    def __getitem__(self, k: int) -> FileInfo:
        if self._rows:
            return self._rows[k]
        a = int(self._ends[k - 1]) + 1 if k else 0
        return FileInfo(self._names[a:int(self._ends[k])].decode("ascii"), int(self.sizes[k]), int(self._head[k]),
                        int(self._tail[k]))

    def encode(self) -> tuple[bytes, dict]:
        """The table's file bytes and its field in the index's ``reference`` (the counts `decode` checks)."""
        names = b"".join(f.name.encode("utf-8") + b"\n" for f in self._rows)
        body = b"".join([np.asarray([f.bytes for f in self._rows], "<u8").tobytes(),
                         np.asarray([f.head for f in self._rows], "<u4").tobytes(),
                         np.asarray([f.tail for f in self._rows], "<u4").tobytes(), names])
        return MAGIC + zlib.compress(body, 6), {"count": len(self._rows), "names": len(names)}

    @classmethod
    def decode(cls, raw: bytes, count: int, names: int) -> ImageFiles:
        """The table of ``count`` files whose names take ``names`` bytes, from its file; ValueError when the bytes
        are not that (inflating at most what the counts allow)."""
        body = inflated(raw, MAGIC, 16 * count + names, "the image table",
                        f"hold {count} files of {names} name bytes")
        out = cls()
        out.sizes = np.frombuffer(body, "<u8", count).astype(np.int64)
        if (np.frombuffer(body, "<u8", count) >= 2**62).any():
            raise ValueError("an image file's size is out of range")
        out._head = np.frombuffer(body, "<u4", count, 8 * count).astype(np.int64)
        out._tail = np.frombuffer(body, "<u4", count, 12 * count).astype(np.int64)
        out._names = body[16 * count:]
        if not _NAMES.fullmatch(out._names) or b".." in out._names:
            raise ValueError("an image file's name is not a relative path of plain names inside the source root "
                             "(no absolute path, URL, '..' or hidden part)")
        out._ends = np.flatnonzero(np.frombuffer(out._names, np.uint8) == ord("\n")).astype(np.int64)
        if len(out._ends) != count:
            raise ValueError(f"the image table names {len(out._ends)} files, not {count}")
        return out


def renumber(file: np.ndarray, files: int) -> np.ndarray:
    """A piece column's image file numbers (from `IMAGE_BASE`) moved to follow the index's ``files`` files."""
    file = np.asarray(file, np.int64)
    return np.where(file >= IMAGE_BASE, file - IMAGE_BASE + files, file)


class Files(Sequence):
    """The source files of an index: the JSON's, then the image table's."""

    def __init__(self, listed: Sequence[FileInfo], images: ImageFiles) -> None:
        self.listed, self.images = list(listed), images
        self.sizes = np.concatenate([np.asarray([f.bytes for f in self.listed], np.int64), images.sizes])

    def __len__(self) -> int:
        return len(self.listed) + len(self.images)

    def __getitem__(self, k):  # noqa: ANN001, ANN204 (an int here)
        return self.listed[k] if k < len(self.listed) else self.images[k - len(self.listed)]


__all__ = ["IMAGE_BASE", "Files", "ImageFiles", "ImageFrames", "placeholder", "remap", "renumber"]
