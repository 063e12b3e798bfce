"""The index's record types: a camera, a per-frame array, a run of frames in a shard, a shard file.

Plain frozen dataclasses, shared by `episodepipes.index` (which makes them from the validated index JSON) and by
everything that plans or reads frames. They are defined here so `EpisodeIndex` is not also the home of its
vocabulary; they keep ``episodepipes.index`` as their public module (docs/API.md, reprs and pickles name it).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Camera:
    """A camera's stored frame size, and its size in the source before ``--resize`` (to rescale pixel labels).

    Attributes:
        name: the camera's key in the episode's ``cameras`` and in batches (its member is ``<name>.jpg``).
        height: the stored frames' height in pixels (a decode of another size is corrupt).
        width: the stored frames' width in pixels.
        source: the camera's name in the source dataset (``name`` is it made tar-safe).
        source_height: the source frames' height in pixels, before any resize at sharding.
        source_width: the source frames' width in pixels, before any resize at sharding.
        codec: how its frames are stored: "jpeg", or the bitstream of its packets ("h264", "av1", "hevc", "vp9").
        gop: frames per keyframe of a video camera (in the members layout frame ``t`` decodes from frame
            ``t - t % gop``; in the packed layout it bounds the packets one frame's decode needs); 1 for JPEG.
        extradata: the decoder setup of a camera whose packets were copied from a container (h264's avcC from an
            mp4, say); empty for most.
    """

    name: str
    height: int
    width: int
    source: str
    source_height: int
    source_width: int
    codec: str = "jpeg"
    gop: int = 1
    extradata: bytes = b""


@dataclass(frozen=True)
class ArraySpec:
    """A per-frame array of an episode (state, action, ...), stored as ``<name>.npy`` in each frame.

    Attributes:
        name: the array's key in the episode's ``arrays`` and in batches.
        dtype: numpy's full ``dtype.str`` (``"<f4"``, ``">f4"``, ``"|u1"``): byte order included, so
            episodes are stacked together only when it is the same.
        shape: one frame's shape (``()`` for a scalar).
        source: the array's name in the source dataset (``name`` is it made tar-safe).
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    source: str


@dataclass(frozen=True)
class Segment:
    """The run of an episode's frames that lives in one shard.

    Attributes:
        shard: the shard's number, an index into `EpisodeIndex.shards`.
        first: the episode frame the run starts at.
        count: how many consecutive frames the run holds.
        offsets: each frame's start byte in the shard; frame ``k``'s bytes end where frame ``k + 1``'s start.
        end: the byte after the run's last frame.
        crc32: ``zlib.crc32`` of each frame's bytes; None in indexes written before checksums.
    """

    shard: int
    first: int
    count: int
    offsets: tuple[int, ...]
    end: int
    crc32: tuple[int, ...] | None = None  # zlib.crc32 of each frame's bytes; None in indexes written before them

    @property
    def start(self) -> int:
        """The run's first byte in the shard (its first frame's offset)."""
        return self.offsets[0]


@dataclass(frozen=True)
class Shard:
    """One finished shard file, as the index records it (`EpisodeIndex.verify` checks the file against it).

    Attributes:
        name: the file's plain name inside the shard folder (never a path).
        bytes: the file's size in bytes.
        sha256: the hex sha256 of the file's bytes.
        samples: how many frames (tar samples) it holds.
    """

    name: str
    bytes: int
    sha256: str
    samples: int


def read_camera(n: str, c: dict) -> Camera:
    """Camera ``n`` from its checked index entry ``c``; fields an older index lacks take their defaults."""
    h, w = c["height"], c["width"]
    return Camera(n, h, w, c.get("source", n), c.get("source_height", h), c.get("source_width", w),
                  c.get("codec", "jpeg"), c.get("gop", 1), bytes.fromhex(c.get("extradata", "")))


@functools.lru_cache(maxsize=256)
def dtype_str(text: str) -> str:
    """numpy's full ``dtype.str`` of ``text`` (byte order included), cached: an index repeats a few dtypes."""
    return np.dtype(text).str


# Their public path since they were first written; `episodepipes.index` re-exports them (numpy's set_module does this).
for _cls in (Camera, ArraySpec, Segment, Shard):
    _cls.__module__ = "episodepipes.index"
