"""LEB128: non-negative integers as bytes, 7 bits a byte, low first, the top bit set on every byte but a value's last.

The statistics side file stores its sketches' key gaps and counts this way (`episodepipes.normstats.sidefile`): most are
below 128, so most take one byte, where a fixed width would be set by the widest value.
"""

from __future__ import annotations

import numpy as np


def encode(v: np.ndarray) -> np.ndarray:
    """Non-negative int64 values as LEB128 bytes (7 bits a byte, low first, the top bit set on all but the last):
    a sketch's gaps and counts are mostly below 128, so mostly one byte each."""
    n = np.ones(len(v), np.int64)
    for j in range(1, 9):
        n += v >= (1 << (7 * j))
    if not len(v) or n.max() == 1:
        return v.astype(np.uint8)
    starts = np.cumsum(n) - n
    out = np.zeros(int(starts[-1] + n[-1]), np.uint8)
    out[starts] = (v & 0x7F) | np.where(n > 1, 0x80, 0)
    wide = np.flatnonzero(n > 1)  # only the few values of more than one byte
    for j in range(1, int(n.max())):
        at = wide[n[wide] > j]
        out[starts[at] + j] = ((v[at] >> (7 * j)) & 0x7F) | np.where(n[at] > j + 1, 0x80, 0)
    return out


def decode(b: np.ndarray, what: str, where: str) -> np.ndarray:
    """`encode` read back (int64), refusing a cut-short, over-long (over 63 bits) or non-canonical value."""
    end = (b & 0x80) == 0
    if end.all():  # every value below 128: the common case of counts
        return b.astype(np.int64)
    starts = np.flatnonzero(np.concatenate([[True], end[:-1]]))
    size = np.diff(np.append(starts, len(b)))
    last = starts + size - 1
    if not end[-1] or (size > 9).any() or ((size > 1) & (b[last] == 0)).any():
        raise ValueError(f"{where}: array {what!r} is not a sequence of canonical LEB128 values below 2**63")
    out = (b[starts] & 0x7F).astype(np.int64)
    for j in range(1, int(size.max())):  # only the few values of more than one byte
        at = np.flatnonzero(size > j)
        out[at] |= (b[starts[at] + j] & 0x7F).astype(np.int64) << (7 * j)
    return out
