"""Many small blobs (a chunk's packets of one camera, or its per-step arrays) as one tar member.

Tar framing costs a 512-byte header and up to 511 bytes of padding per member, which dwarfs 1-5 KB video
packets; one member per chunk pays it once. The member is ``EPK1``, a little-endian uint32 count, the count's
uint32 end offsets (relative to the payload), then the blobs back to back, so a blob is readable by byte range
once its offset is known (`entry_ranges` gives the index those ranges at write time).
"""

from __future__ import annotations

import io
import itertools
import json
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from episodepipes.codec.stream import Packets
from episodepipes.format import npy_load

MAGIC = b"EPK1"
TAR_BLOCK = 512
MAX_ENTRIES = 1 << 20


def _header_size(n: int) -> int:
    return 8 + 4 * n


def pack(blobs: Sequence[bytes]) -> bytes:
    """One member holding ``blobs`` in order."""
    ends = list(itertools.accumulate(len(b) for b in blobs))  # plain ints: a record packs a few blobs, where
    if len(blobs) > MAX_ENTRIES or (ends and ends[-1] >= 1 << 32):  # numpy's per-call cost would rule
        raise ValueError(f"{len(blobs)} blobs of {ends[-1] if ends else 0} bytes do not fit one pack "
                         f"(at most {MAX_ENTRIES} blobs and 4 GiB); use smaller chunks")
    return b"".join([MAGIC, struct.pack(f"<I{len(ends)}I", len(ends), *ends), *blobs])


def entry_ranges(sizes: Sequence[int]) -> list[tuple[int, int]]:
    """(offset within the member, size) of each blob `pack` would write for blobs of these sizes."""
    starts = _header_size(len(sizes)) + np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)[:-1]])
    return [(int(o), int(s)) for o, s in zip(starts, sizes)]


def unpack(data: bytes, *, where: str = "pack") -> list[memoryview]:
    """The blobs of a member `pack` wrote; a member that is not one, or whose table lies, is refused."""
    view = memoryview(data)
    if len(view) < 8 or bytes(view[:4]) != MAGIC:
        raise ValueError(f"{where}: not a packed member (no {MAGIC!r} header); the shard is damaged, re-shard it")
    (n,) = struct.unpack("<I", view[4:8])
    head = _header_size(n)
    if n > MAX_ENTRIES or head > len(view):
        raise ValueError(f"{where}: its table claims {n} entries, more than its {len(view)} bytes hold; re-shard it")
    out, prev = [], head  # a loop over the table: a record holds a few blobs, where numpy's per-call cost rules
    for end in struct.unpack_from(f"<{n}I", view, 8):
        end += head
        if end < prev:
            break
        out.append(view[prev:end])
        prev = end
    if len(out) != n or prev != len(view):
        raise ValueError(f"{where}: its offset table does not match its {len(view)} bytes; the shard is damaged")
    return out


def pack_arrays(arrays: Mapping[str, np.ndarray]) -> bytes:
    """A chunk's per-step arrays (each stacked over the chunk's steps) as one member: the keys as JSON, then one
    ``.npy`` per key in sorted order, so a step's row is a fixed byte range of its entry."""
    keys = sorted(arrays)
    blobs = [json.dumps(keys).encode()]
    for k in keys:
        buf = io.BytesIO()
        np.save(buf, np.ascontiguousarray(arrays[k]), allow_pickle=False)
        blobs.append(buf.getvalue())
    return pack(blobs)


def unpack_arrays(data: bytes, *, where: str = "pack") -> dict[str, np.ndarray]:
    """The arrays `pack_arrays` wrote (pickle never loaded; dtypes come back in native byte order)."""
    blobs = unpack(data, where=where)
    try:
        keys = json.loads(bytes(blobs[0])) if blobs else None
    except ValueError:
        keys = None
    if not isinstance(keys, list) or len(keys) != len(blobs) - 1 or not all(isinstance(k, str) for k in keys):
        raise ValueError(f"{where}: its array keys do not match its {len(blobs) - 1} entries; re-shard it")
    try:
        return {k: npy_load(bytes(b)) for k, b in zip(keys, blobs[1:])}
    except ValueError as e:
        raise ValueError(f"{where}: an array entry does not read ({e}); re-shard it") from None


def tar_framing(sizes: Iterable[int]) -> int:
    """Bytes a tar spends on members of these sizes beyond their data: a header block and the padding each."""
    return sum(TAR_BLOCK + (-s % TAR_BLOCK) for s in sizes)


def gop_chunks(key: np.ndarray, frames: int) -> list[tuple[int, int]]:
    """Packet ranges ``[a, b)`` of whole GOPs, each at least ``frames`` packets long (the last may be shorter),
    so a chunk never splits a GOP and a frame's decode never spans two members."""
    if frames < 1:
        raise ValueError(f"{frames=} should be >= 1")
    starts = [int(i) for i in np.flatnonzero(np.asarray(key) == np.arange(len(key)))]
    out, a = [], 0
    for s in starts[1:]:
        if s - a >= frames:
            out.append((a, s))
            a = s
    if len(key):
        out.append((a, len(key)))
    return out


@dataclass(frozen=True)
class Chunk:
    """One member of a camera's packets: packets ``first .. first + len(ranges)`` of its `Packets`."""

    member: bytes
    first: int
    ranges: list[tuple[int, int]]  # (offset within the member, size) per packet, for the index


def pack_packets(p: Packets, frames: int) -> list[Chunk]:
    """A camera's packets as members of whole GOPs, each at least ``frames`` packets (leading ones included)."""
    out = []
    for a, b in gop_chunks(p.key, frames):
        blobs = p.data[a:b]
        out.append(Chunk(pack(blobs), a, entry_ranges([len(x) for x in blobs])))
    return out
