"""Shard format: names and byte layout shared by the writer and the readers.

The tars are the same in both versions. Version 1 keeps every frame's byte offset in ``index.json``;
version 2 keeps a small ``index.json`` (shards, schemas, per-episode attributes) and the per-frame and
per-episode numbers in ``.npy`` columns beside it, memory-mapped at open (see `episodepipes.index.v2`).

In the ``members`` layout (JPEG shards) one sample is one frame of one episode. Its tar members are named
``<episode_id>/<frame:06d>.<field>`` so that webdataset's ``base_plus_ext`` groups them by
``<episode_id>/<frame:06d>``. Fields are ``<camera>.jpg``, ``<array_key>.npy`` and ``json``.

In the ``packed`` layout (h264/AV1/copied packets, index v2 only) one member ``<episode_id>/<first:06d>.epk`` holds
a chunk of an episode's frames, one record each (`episodepipes.codec.chunk`; the columns in `episodepipes.index.v2`),
so the 512-byte header and padding are paid per chunk, not per frame and field.
"""

from __future__ import annotations

import functools
import io
import json
import math
import re
import tarfile

import numpy as np

FORMAT_NAME = "episodepipes-shards"
FORMAT_VERSION = 2
VERSIONS = (1, 2)  # what this episodepipes reads; it writes FORMAT_VERSION
INDEX_NAME = "index.json"
# v2 columns: fixed file names beside index.json (never taken from the index's data), dtype, and number of
# columns of a 2-D table (0 for a 1-D column). "crc32" is present only when the index says so.
COLUMNS: dict[str, tuple[str, str, int]] = {
    "episodes": ("index.episodes.npy", "<u8", 7),  # first frame row, length, first segment, schema, split, prompt, fps
    "segments": ("index.segments.npy", "<u8", 3),  # shard, first frame row, frame count
    "offset": ("index.offset.npy", "<u8", 0),  # a frame's first byte in its shard
    "size": ("index.size.npy", "<u4", 0),  # its bytes (all its members, headers and padding included)
    "crc32": ("index.crc32.npy", "<u4", 0),  # zlib.crc32 of those bytes
    "member": ("index.member.npy", "<u8", 0),  # packed: the byte its chunk's tar member (header) starts at
    "key": ("index.key.npy", "<u8", 0),  # packed: the frame row its decode reads from (itself, or an earlier one)
    # per episode, written since ids and attributes left index.json (`episodepipes.index.idcols`); an index whose
    # JSON still lists "ids" has none of them
    "ids": ("index.ids.npy", "|S", 0),  # each episode's id, ASCII, NUL-padded to the longest ("|S<width>")
    "id_order": ("index.id_order.npy", "<i8", 0),  # the episode numbers in the ids' sorted order (lookup by id)
    "attr": ("index.attr.npy", "<u4", 0),  # each episode's code into the JSON's "attrs" (its attributes)
}
EPISODE_COLUMNS = ("ids", "id_order", "attr")
# v2: "members": each frame is a run of whole tar members at [offset, offset + size); "packed": each frame is one
# record inside its chunk's member (`episodepipes.codec.chunk`), [offset, offset + size) being that record
LAYOUTS = ("members", "packed")
PACKED_COLUMNS = ("member", "key")
MAX_BACK = 1024  # packed: frames a decode may start before the one it gives (a camera's gop is at most 1001)
BLOCK = 512

_SAFE = re.compile(r"[^A-Za-z0-9_\-]")
_SAFE_ID = re.compile(r"[^A-Za-z0-9_\-.]")


def shard_name(i: int) -> str:
    """File name of the i-th shard."""
    return f"shard-{i:06d}.tar"


def safe_field(name: str) -> str:
    """A camera or array name usable as a tar field: no dots, slashes or spaces."""
    out = _SAFE.sub("_", name)
    if not out:
        raise ValueError(f"name {name!r} has no usable characters; rename it")
    return out


def safe_episode_id(name: str) -> str:
    """An episode id usable as the directory part of a tar member name."""
    out = _SAFE_ID.sub("_", str(name)).strip(".")
    if not out:
        raise ValueError(f"episode id {name!r} has no usable characters; rename it")
    return out


# Frame rates an episode may have: what a video container stores as a frame duration (an mp4 time scale is a 32-bit
# count of ticks per second, and a writer's timestamps are frame numbers over the rate). Both bounds are exact in
# binary floating point up to the decimal a user types; a rate outside them is refused where it is read.
MIN_FPS, MAX_FPS = 0.001, 1000


def fps_in_range(value: float) -> bool:
    """``MIN_FPS <= value <= MAX_FPS``: False for NaN, infinities and an int past a float's range too."""
    return MIN_FPS <= value <= MAX_FPS


def finite(value: float) -> bool:
    """``math.isfinite(value)``, False for an int past a float's range instead of an OverflowError: JSON reads ``1``
    and 400 zeros as that exact int, which no fps or time in seconds can be."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def sample_key(episode_id: str, frame: int) -> str:
    return f"{episode_id}/{frame:06d}"


def frame_json(episode_id: str, frame: int, fps: float) -> bytes:
    """The ``json`` member of a frame: its episode, number and timestamp (seconds, from the episode's fps).

    The packed layout stores no json member: its readers make these same bytes from the index.
    """
    t = round(frame / fps, 9)
    stamp = float.__repr__(t) if math.isfinite(t) else json.dumps(t)  # json.dumps's float text
    return b'{"episode": %s, "frame": %d, "timestamp": %s}' % (json.dumps(episode_id).encode(), frame, stamp.encode())


def _tar_header(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = 0
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info.tobuf(format=tarfile.GNU_FORMAT, encoding="utf-8", errors="strict")


_TEMPLATE = _tar_header("", 0)
_MAX_SIZE = 8**11  # above this GNU tar switches the size field to base-256
# the header checksum is the byte sum with its own field as 8 spaces; name and size are added per member
_BASE_SUM = sum(_TEMPLATE[100:124]) + sum(_TEMPLATE[136:148]) + 8 * ord(" ") + sum(_TEMPLATE[156:])


def _fast_header(name: bytes, size: int) -> bytes:
    """`_tar_header`'s bytes for a short name, built from a template: tarfile spends ~45 us per header,
    several times a frame, which was a third of the per-frame cost of sharding."""
    size_field = b"%011o\0" % size
    chksum = _BASE_SUM + sum(name) + sum(size_field)
    return b"".join((name.ljust(100, b"\0"), _TEMPLATE[100:124], size_field, _TEMPLATE[136:148],
                     b"%06o\0 " % chksum, _TEMPLATE[156:]))


def _octal(values: np.ndarray, width: int) -> np.ndarray:
    """ASCII octal digits, zero-padded to ``width``, of each value: shape (len(values), width)."""
    shifts = 3 * np.arange(width - 1, -1, -1, dtype=np.int64)
    return ((values.astype(np.int64)[:, None] >> shifts) & 7 | ord("0")).astype(np.uint8)


def tar_headers(names: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """`tar_header` of many members at once, as rows of a (k, 512) uint8 array.

    ``names`` is (k, L) uint8 with L <= 100 and ``sizes`` holds k sizes below 8**11: the shard encoder
    makes every header of an episode's column (one camera, one array) in a few numpy calls.
    """
    out = np.tile(np.frombuffer(_TEMPLATE, np.uint8), (len(names), 1))
    out[:, :names.shape[1]] = names
    out[:, 124:135] = _octal(sizes, 11)
    out[:, 148:156] = ord(" ")  # the checksum is the byte sum with its own field as spaces
    out[:, 148:154] = _octal(out.sum(axis=1, dtype=np.int64), 6)
    out[:, 154] = 0
    return out


def tar_header(name: bytes, size: int) -> bytes:
    """The header block(s) of a member called ``name`` (UTF-8) holding ``size`` bytes."""
    if len(name) <= 100 and size < _MAX_SIZE:
        return _fast_header(name, size)
    return _tar_header(name.decode("utf-8"), size)  # a GNU longname header: leave it to tarfile


def tar_member_parts(name: str, data: bytes) -> tuple[bytes, bytes, bytes]:
    """One tar member as (header, data, padding), to be joined with its neighbours in one copy."""
    return tar_header(name.encode("utf-8"), len(data)), data, b"\0" * ((-len(data)) % BLOCK)


def tar_member(name: str, data: bytes) -> bytes:
    """One tar member (header, data, padding) with fixed metadata, so output is byte-reproducible."""
    return b"".join(tar_member_parts(name, data))


TAR_END = b"\0" * (2 * BLOCK)


@functools.lru_cache(maxsize=1024)
def npy_header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    """The bytes `npy_bytes` puts before the data of an array of this dtype and shape."""
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.zeros(shape, dtype), allow_pickle=False)
    return buf.getvalue()[: buf.tell() - int(np.prod(shape, dtype=np.int64)) * dtype.itemsize]


def npy_bytes(array: np.ndarray) -> bytes:
    """Lossless, deterministic .npy encoding of one array (``np.save``'s bytes).

    The header depends only on dtype and shape, so it is built once: numpy's writer costs ~60 us
    per call, and the sharder calls it for every array of every frame.
    """
    array = np.asarray(array)
    if not array.flags.c_contiguous:  # not np.ascontiguousarray: it turns a per-step scalar into shape (1,)
        array = array.copy(order="C")
    if array.dtype.hasobject:
        raise ValueError(f"array of dtype {array.dtype} holds Python objects; store numbers or strings")
    return npy_header(array.dtype, array.shape) + array.tobytes()


def npy_load(data: bytes) -> np.ndarray:
    """The array an .npy member holds, in native byte order: torch takes no other, and the swap is exact."""
    array = np.lib.format.read_array(io.BytesIO(data), allow_pickle=False)
    return array if array.dtype.isnative else array.astype(array.dtype.newbyteorder("="))


_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,254}")


def check_name(name: str) -> str:
    """``name`` if it is a plain file name inside the root (no separator, scheme, ``..`` or leading dot/dash)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or ".." in name:
        raise ValueError(f"file name {name!r} is not a plain base name inside the dataset folder")
    return name
