"""The piece table of a ``--codec reference`` index as one small file: delta coded, then deflated.

The three columns (`reference.PIECE_DTYPES`: each piece's start in its shard, file, and where it lies in that file)
take 20 bytes a piece, three pieces a frame: as much as the frames' own index. They are mostly predictable: a piece
starts where the one before it ends, and the next piece of the same file lies right after the last one (a camera's
packets are back to back in its mp4; the literal pieces tile the literal file). So the file holds each piece's size
(bytes transposed: sizes differ in their low bytes only), its file, and where it lies *past* where the previous piece
of its file ended (zero but at a file's first piece or a skipped packet), deflated. Reading inflates at most the
bytes the piece count allows (a deflate bomb is refused), rebuilds the columns, and `reference.check_pieces` then
checks them as before.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np

from episodepipes.codec.reference_blocks import inflated

MAGIC = b"EPREF1\n\0"
_ROW = 4 + 4 + 8  # size, file, gap


def _groups(file: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the pieces in file order, stable; whether each is its file's first)."""
    order = np.argsort(file, kind="stable")
    f = file[order]
    return order, np.r_[True, f[1:] != f[:-1]] if len(f) else np.zeros(0, bool)


def _sizes(start: np.ndarray, shard_bytes: Sequence[int]) -> np.ndarray:
    first = np.flatnonzero(start == 0)
    if len(first) != len(shard_bytes) or (len(start) and first[0] != 0):
        raise ValueError(f"the pieces start {len(first)} shards, the index lists {len(shard_bytes)}")
    nxt = np.empty(len(start), np.int64)
    nxt[:-1] = start[1:]
    if len(start):
        nxt[np.append(first[1:], len(start)) - 1] = np.asarray(shard_bytes, np.int64)
    return nxt - start


def encode(cols: dict[str, np.ndarray], shard_bytes: Sequence[int]) -> bytes:
    """The file's bytes for the columns ``start``, ``file``, ``at`` of pieces tiling shards of these sizes."""
    start, file, at = (np.asarray(cols[k], np.int64) for k in ("start", "file", "at"))
    size = _sizes(start, shard_bytes)
    order, first = _groups(file)
    s, a = size[order], at[order]
    gap_sorted = np.where(first, a, a - np.r_[0, a[:-1] + s[:-1]])
    gap = np.empty_like(gap_sorted)
    gap[order] = gap_sorted
    body = b"".join([size.astype("<u4").view(np.uint8).reshape(-1, 4).T.tobytes(), file.astype("<i4").tobytes(),
                     gap.astype("<i8").tobytes()])
    if (size >= 2**32).any():
        raise ValueError("a piece of 4 GiB or more; lower --shard-size")
    return MAGIC + zlib.compress(body, 6)


def decode(raw: bytes, count: int, shard_bytes: Sequence[int]) -> dict[str, np.ndarray]:
    """The columns of ``count`` pieces from the file's bytes; ValueError when they are not that."""
    body = inflated(raw, MAGIC, count * _ROW, "the piece file", f"hold {count} pieces")
    size = np.frombuffer(body, np.uint8, 4 * count).reshape(4, count).T.copy().view("<u4").ravel().astype(np.int64)
    file = np.frombuffer(body, "<i4", count, 4 * count).copy()
    gap = np.frombuffer(body, "<i8", count, 8 * count).astype(np.int64)
    if (gap < -(2**62)).any() or (gap > 2**62).any():
        raise ValueError("a piece lies out of any file")
    start = np.cumsum(size) - size
    shard_starts = _shard_firsts(size, shard_bytes)
    start -= np.repeat(start[shard_starts], np.diff(np.append(shard_starts, count)))
    order, first = _groups(file)
    s = size[order]
    inc = gap[order] + np.where(first, 0, np.r_[0, s[:-1]])
    run = np.cumsum(inc)
    heads = np.flatnonzero(first)
    base = np.repeat(run[heads] - inc[heads], np.diff(np.append(heads, count)))
    at = np.empty(count, np.int64)
    at[order] = run - base
    if (at < 0).any():
        raise ValueError("a piece lies before its file's start")
    return {"start": start.astype("<u8"), "file": file.astype("<i4"), "at": at.astype("<u8")}


def _shard_firsts(size: np.ndarray, shard_bytes: Sequence[int]) -> np.ndarray:
    """Each shard's first piece: the pieces' sizes add up to each shard's bytes in turn."""
    ends = np.cumsum(np.asarray(shard_bytes, np.int64))
    total = np.cumsum(size)
    firsts = np.searchsorted(total, ends[:-1], side="right") if len(ends) else np.zeros(0, np.int64)
    if len(ends) and (len(total) == 0 or total[-1] != ends[-1] or (firsts < 1).any()
                      or (total[np.maximum(firsts - 1, 0)] != ends[:-1]).any()):
        raise ValueError(f"the pieces do not tile the {len(shard_bytes)} shards' bytes")
    return np.r_[0, firsts].astype(np.int64) if len(ends) else np.zeros(0, np.int64)


__all__ = ["decode", "encode"]
