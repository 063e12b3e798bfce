"""The per-frame columns of a ``--codec reference`` index (offset, size, crc32, member, key) as one deflated file.

A copy index maps its per-frame columns (`episodepipes.format.COLUMNS`, 32 bytes a frame); an in-place index is
meant to be a small fraction of its dataset, and these columns are mostly predictable: a record starts where the
one before it ends (but at a chunk's first), a frame's chunk is its predecessor's, its key frame a few frames back.
So the file holds each frame's size (bytes transposed: sizes differ in their low bytes), its crc32, how many frames
back its key frame is, and its offset and member *past* the predicted ones (zero but at a chunk's first frame),
deflated. Reading inflates at most the bytes the frame count allows, rebuilds the columns in memory (the piece table
is in memory too), and the index's usual checks (`index.v2.check_tables`, the packed layout's per-segment checks)
then check them as mapped columns are checked.
"""

from __future__ import annotations

import zlib

import numpy as np

from episodepipes.codec.reference_blocks import inflated

MAGIC = b"EPFRM1\n\0"
NAMES = ("offset", "size", "crc32", "member", "key")
_ROW = 4 + 4 + 4 + 8 + 8  # size, crc32, back, offset gap, member step
_LIMIT = 1 << 48  # a decoded offset or member past this is refused (no shard is that large), so sums never wrap


def _planes(a: np.ndarray, dtype: str) -> bytes:
    """``a`` as ``dtype``, its bytes transposed (all first bytes, then all second bytes, ...)."""
    width = np.dtype(dtype).itemsize
    return np.ascontiguousarray(a.astype(dtype).view(np.uint8).reshape(-1, width).T).tobytes()


def _unplanes(body: bytes, at: int, count: int, dtype: str) -> np.ndarray:
    width = np.dtype(dtype).itemsize
    return np.frombuffer(body, np.uint8, count * width, at).reshape(width, count).T.copy().view(dtype).ravel()


def encode(cols: dict[str, np.ndarray]) -> bytes:
    """The file's bytes for the per-frame columns `NAMES` (one row per frame, index order)."""
    off, size, crc, member, key = (np.asarray(cols[k]).astype(np.int64) for k in NAMES)
    n = len(off)
    back = np.arange(n, dtype=np.int64) - key
    if n and (back.min() < 0 or back.max() >= 2**32 or size.max() >= 2**32):
        raise ValueError("a frame's key frame lies after it or over 2**32 frames back, or it is 4 GiB or more")
    gap = off.copy()
    gap[1:] -= off[:-1] + size[:-1]
    step = member.copy()
    step[1:] -= member[:-1]
    body = b"".join([_planes(size, "<u4"), crc.astype("<u4").tobytes(), _planes(back, "<u4"), _planes(gap, "<i8"),
                     _planes(step, "<i8")])
    return MAGIC + zlib.compress(body, 6)


def decode(raw: bytes, count: int) -> dict[str, np.ndarray]:
    """The columns of ``count`` frames from the file's bytes, in `episodepipes.format.COLUMNS`'s dtypes; ValueError
    naming what is wrong when they are not that (the values' own checks are the index's)."""
    body = inflated(raw, MAGIC, count * _ROW, "the frames file", f"hold {count} frames")
    size = _unplanes(body, 0, count, "<u4").astype(np.int64)
    crc = np.frombuffer(body, "<u4", count, 4 * count).copy()
    back = _unplanes(body, 8 * count, count, "<u4").astype(np.int64)
    gap = _unplanes(body, 12 * count, count, "<i8")
    step = _unplanes(body, 20 * count, count, "<i8")
    if count and (np.abs(gap).max() >= _LIMIT or np.abs(step).max() >= _LIMIT):
        raise ValueError("a frame's offset or member lies past any shard")
    inc = gap.copy()
    inc[1:] += size[:-1]
    off, member = np.cumsum(inc), np.cumsum(step)  # each step < 2**49: a sum that leaves [0, 2**48) is seen
    key = np.arange(count, dtype=np.int64) - back  # before it could wrap
    for name, col in (("offset", off), ("member", member), ("key", key)):
        if count and (col.min() < 0 or col.max() >= _LIMIT):
            raise ValueError(f"a frame's {name} lies outside its shard or before the first frame")
    return {"offset": off.astype("<u8"), "size": size.astype("<u4"), "crc32": crc.astype("<u4"),
            "member": member.astype("<u8"), "key": key.astype("<u8")}


__all__ = ["NAMES", "decode", "encode"]
