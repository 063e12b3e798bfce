"""The packed layout's bytes: frame records, and chunks of them as one tar member (see `episodepipes.index.v2`).

A chunk is a run of an episode's frames that holds whole GOPs of every camera; it is one tar member
``<episode>/<first:06d>.epk`` whose data is `episodepipes.codec.pack` of one *record* per frame. A record is
itself a pack: a head (``<u2`` back, ``<u2`` packet count per camera, cameras in sorted order), then each camera's
packets (one, or the leading packets of a copied stream before frame 0's own; a JPEG camera's JPEG), then each
array's row (its raw C-order bytes in the index's dtype, arrays in sorted order). ``back`` is how many earlier frames
the camera's decode starts before this one (0 at a keyframe). Records are back to back, so a frame and the frames
its GOP needs are one byte range, and a record is the unit the index's offset, size and CRC32 describe.
"""

from __future__ import annotations

import struct
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from episodepipes.codec.pack import MAGIC, MAX_ENTRIES, pack, unpack
from episodepipes.format import MAX_BACK, tar_header

EXT = "epk"  # the member name's field
CHUNK_FRAMES = 64  # a chunk ends at the first all-camera keyframe after this many frames ...
CHUNK_BYTES = 1 << 20  # ... or after this many bytes of records


def record(backs: Sequence[int], cameras: Sequence[Sequence[bytes]], rows: Sequence[bytes]) -> bytes:
    """One frame's record: per camera its back and packets, then the arrays' rows."""
    head = b"".join(struct.pack("<HH", b, len(p)) for b, p in zip(backs, cameras))
    return pack([head, *(x for p in cameras for x in p), *rows])


@dataclass(frozen=True)
class Record:
    """A parsed record: per camera its back and blobs (packets, or a JPEG), and per array its row bytes."""

    backs: tuple[int, ...]
    cameras: tuple[tuple[memoryview, ...], ...]
    rows: tuple[memoryview, ...]


def parse_record(data: bytes | memoryview, cameras: int, arrays: int, *, where: str = "record") -> Record:
    """The record `record` wrote for ``cameras`` cameras and ``arrays`` arrays; ValueError if it is not one."""
    blobs = unpack(data, where=where)
    if not blobs or len(blobs[0]) != 4 * cameras:
        raise ValueError(f"{where}: its head does not describe {cameras} cameras; the shard is damaged")
    head = struct.unpack_from(f"<{2 * cameras}H", blobs[0])  # per record, so plain struct, not numpy's per-call cost
    backs, counts = head[::2], head[1::2]
    if min(counts, default=1) < 1 or 1 + sum(counts) + arrays != len(blobs):
        raise ValueError(f"{where}: its head's packet counts do not match its {len(blobs)} entries; the shard "
                         "is damaged")
    cams, at = [], 1
    for k in counts:
        cams.append(tuple(blobs[at:at + k]))
        at += k
    return Record(backs, tuple(cams), tuple(blobs[at:]))


def cuts(backs: np.ndarray, sizes: Sequence[int], *, frames: int = CHUNK_FRAMES,
         nbytes: int = CHUNK_BYTES) -> list[tuple[int, int]]:
    """Frame ranges ``[a, b)`` of the chunks: each starts where no camera needs an earlier frame."""
    n = len(sizes)
    free = ~np.asarray(backs, np.int64).reshape(n, -1).any(axis=1)
    out, a, held = [], 0, 0
    for t in range(n):
        if t > a and free[t] and (t - a >= frames or held >= nbytes):
            out.append((a, t))
            a, held = t, 0
        held += sizes[t]
    if n:
        out.append((a, n))
    return out


@dataclass(frozen=True)
class Spans:
    """Where each frame of an episode's packed bytes is, as the writer indexes it.

    ``heads[i]``: bytes before frame i's record that belong to it (its chunk's tar header and pack table, for a
    chunk's first frame; else 0); ``sizes[i]``: its record's bytes; ``spans[i]``: all its bytes (head, record and,
    for a chunk's last frame, the member's padding); ``ends[i]``: a chunk ends after it; ``keys[i]``: the frame its
    decode reads from.
    """

    heads: list[int]
    sizes: list[int]
    spans: list[int]
    ends: list[bool]
    keys: list[int]


def spans(data: bytes | memoryview, *, where: str) -> Spans:
    """Walk the chunk members of one episode's packed bytes (from its frame 0) and locate every record.

    Every chunk's tar header and pack table, and every record's own pack table and head, are checked; the records'
    checks run over all of them at once (numpy), since a Python loop per record cost the single writer more than
    hashing and writing the episode.
    """
    view = memoryview(data)
    arr = np.frombuffer(view, np.uint8)
    starts: list[np.ndarray] = []  # per chunk: its records' first bytes within ``data``, and one past the last
    heads: list[int] = []
    spans_: list[int] = []
    ends: list[bool] = []
    pos = 0
    while pos < len(view):
        start = pos
        info = _header(view[pos:pos + 512], where, pos)
        pos += 512
        if info.type == tarfile.GNUTYPE_LONGNAME:
            pos += -(-info.size // 512) * 512
            info = _header(view[pos:pos + 512], where, pos)
            pos += 512
        member = view[pos:pos + info.size]
        if len(member) != info.size or bytes(member[:4]) != MAGIC:
            raise ValueError(f"{where}: byte {start} starts no packed chunk; re-shard it")
        table = _table(member, f"{where} chunk at byte {start}")
        if len(table) < 2:
            raise ValueError(f"{where}: the chunk at byte {start} holds no frames; re-shard it")
        starts.append(pos + table)
        n, head = len(table) - 1, pos - start + 8 + 4 * (len(table) - 1)
        sizes = np.diff(table)
        pos += -(-info.size // 512) * 512
        share = sizes.tolist()
        share[0] += head
        share[-1] += (pos - start) - head - int(table[-1] - table[0])
        heads += [head] + [0] * (n - 1)
        spans_ += share
        ends += [False] * (n - 1) + [True]
    if not starts:
        return Spans([], [], [], [], [])
    a = np.concatenate([s[:-1] for s in starts])
    b = np.concatenate([s[1:] for s in starts])
    k = np.concatenate([np.arange(len(s) - 1) for s in starts])  # each record's place in its chunk
    back = _record_backs(arr, a, b, where)
    t = np.arange(len(a))
    late = np.flatnonzero(back > k)
    if len(late):
        raise ValueError(f"{where} frame {int(late[0])}: its decode starts before its chunk; re-shard it")
    return Spans(heads, (b - a).tolist(), spans_, ends, (t - back).tolist())


def _u4(arr: np.ndarray, at: np.ndarray) -> np.ndarray:
    """The little-endian uint32 at each offset ``at`` of ``arr`` (every one in bounds), as int64."""
    return arr[at[:, None] + np.arange(4)].copy().view("<u4").reshape(-1).astype(np.int64)


def _table(member: memoryview, where: str) -> np.ndarray:
    """A pack's blob bounds, relative to the member: its first blob's start, then each blob's end; as `unpack`
    checks it (a table that claims more than the member holds, or ends that go back or miss its end, is refused)."""
    (n,) = struct.unpack_from("<I", member, 4) if len(member) >= 8 else (-1,)
    head = 8 + 4 * n
    if n < 0 or n > MAX_ENTRIES or head > len(member):
        raise ValueError(f"{where}: its table claims {n} entries, more than its {len(member)} bytes hold; re-shard it")
    bounds = np.concatenate([[0], np.frombuffer(member, "<u4", n, 8).astype(np.int64)]) + head
    if np.any(np.diff(bounds) < 0) or bounds[-1] != len(member):
        raise ValueError(f"{where}: its offset table does not match its {len(member)} bytes; the shard is damaged")
    return bounds


def _record_backs(arr: np.ndarray, a: np.ndarray, b: np.ndarray, where: str) -> np.ndarray:
    """Per record ``arr[a[i]:b[i]]``: checked as `parse_record`'s pack (magic, table), the most frames any camera's
    decode starts before it (`MAX_BACK` if its head is not whole (back, count) pairs)."""
    size = b - a

    def refuse(bad: np.ndarray, what: str) -> None:
        if bad.any():
            t = int(np.flatnonzero(bad)[0])
            raise ValueError(f"{where} frame {t}: {what.format(size=int(size[t]))}; the shard is damaged, re-shard it")

    refuse(size < 8, f"not a packed member (no {MAGIC!r} header)")
    refuse((arr[a[:, None] + np.arange(4)] != np.frombuffer(MAGIC, np.uint8)).any(axis=1),
           f"not a packed member (no {MAGIC!r} header)")
    n = _u4(arr, a + 4)
    head = 8 + 4 * n
    refuse((n < 1) | (n > MAX_ENTRIES) | (head > size), "its table claims more entries than its {size} bytes hold")
    first = np.cumsum(n) - n  # each record's first entry in the flat tables
    rec = np.repeat(np.arange(len(a)), n)
    end = _u4(arr, a[rec] + 8 + 4 * (np.arange(len(rec)) - first[rec])) + head[rec]  # relative to the record
    back_step = np.diff(end) < 0
    back_step &= rec[1:] == rec[:-1]
    refuse(np.bincount(rec[1:][back_step], minlength=len(a)) > 0, "its offset table does not match its {size} bytes")
    refuse(end[first + n - 1] != size, "its offset table does not match its {size} bytes")
    width = end[first] - head  # the head blob: (back, count) <u2 pairs, one per camera
    whole = width % 4 == 0
    cams = np.where(whole, width // 4, 0)
    owner = np.repeat(np.arange(len(a)), cams)
    at = (a + head)[owner] + 4 * (np.arange(len(owner)) - (np.cumsum(cams) - cams)[owner])
    backs = (arr[at].astype(np.int64) | (arr[at + 1].astype(np.int64) << 8))
    out = np.zeros(len(a), np.int64)
    np.maximum.at(out, owner, backs)
    out[~whole] = MAX_BACK
    return out


def _header(block: memoryview, where: str, pos: int) -> tarfile.TarInfo:
    try:
        return tarfile.TarInfo.frombuf(bytes(block), "utf-8", "surrogateescape")
    except tarfile.HeaderError as e:
        raise ValueError(f"{where}: no tar header at byte {pos} ({e}); re-shard it") from None


def layout(episode: bytes, records: Sequence[bytes], backs: np.ndarray) -> tuple[list, list[int]]:
    """(parts, spans) of an episode's records cut into chunk members: parts joined are its tar bytes, and
    ``spans[i]`` frame i's share of them (what `spans` finds again when it walks the bytes)."""
    parts: list = []
    out: list[int] = []
    for a, b in cuts(backs, [len(r) for r in records]):
        member = pack(records[a:b])
        head = tar_header(b"%s/%06d.%s" % (episode, a, EXT.encode()), len(member))
        pad = -len(member) % 512
        parts += (head, member, bytes(pad))
        sizes = [len(r) for r in records[a:b]]
        sizes[0] += len(head) + 8 + 4 * (b - a)
        sizes[-1] += pad
        out += sizes
    return parts, out
