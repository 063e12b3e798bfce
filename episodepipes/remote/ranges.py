"""Coalescing: which ranged GETs cover a set of byte ranges. A pure function, so it is property-tested alone."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Request:
    """One ranged GET ``[start, end)`` and the indices of the asked-for ranges it covers."""

    start: int
    end: int
    members: tuple[int, ...]


def check_ranges(ranges: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """``ranges`` as ``(offset, size)`` pairs of non-negative ints; a ValueError names the first bad one."""
    out = []
    for i, r in enumerate(ranges):
        ok = isinstance(r, tuple | list) and len(r) == 2 and all(type(x) is int and x >= 0 for x in r)
        if not ok:
            raise ValueError(f"ranges[{i}]={r!r} should be an (offset, size) pair of non-negative ints")
        out.append((r[0], r[1]))
    return out


def coalesce(ranges: Sequence[tuple[int, int]], *, gap: int, max_request: int,
             waste: float | None = None) -> list[Request]:
    """Merge ranges whose gap is at most ``gap`` bytes into GETs of at most ``max_request`` bytes.

    Overlapping and repeated ranges share a GET. Empty ranges need no bytes and belong to no request.
    A single range longer than ``max_request`` still gets one GET of its own: splitting it buys nothing.
    The bytes fetched beyond the ranges' own are bounded by ``gap`` per merge, and with ``waste`` by that
    fraction of the ranges' own bytes in every GET: a gap is read through only while the GET stays within
    ``(1 + waste)`` times its ranges' union, so a sparse plan (a few frames per episode) costs at most that
    ratio of its bytes, and a dense one (a header skipped per frame) still merges into one GET.
    """
    order = sorted((i for i, (_, n) in enumerate(ranges) if n > 0), key=lambda i: ranges[i][0])
    out: list[Request] = []
    start = end = covered = 0
    members: list[int] = []
    for i in order:
        off, n = ranges[i]
        new_end = max(end, off + n)
        new_covered = covered + new_end - max(end, off)
        if members and off <= end + gap and new_end - start <= max_request and \
                (waste is None or new_end - start - new_covered <= waste * new_covered):
            end, covered = new_end, new_covered
            members.append(i)
            continue
        if members:
            out.append(Request(start, end, tuple(members)))
        start, end, covered, members = off, off + n, n, [i]
    if members:
        out.append(Request(start, end, tuple(members)))
    return out
