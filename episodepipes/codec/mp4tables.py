"""An mp4's packets read from its sample tables (``moov/trak/mdia/minf/stbl``), without demuxing a packet.

``--codec reference`` needs, per packet of a file's first video track, its byte position, size, time and keyframe
flag, and the decoder's setup: what FFmpeg's mov demuxer gives packet by packet, here read from a few kilobytes of
tables (``stsz``, ``stco``/``co64``, ``stsc``, ``stts``, ``stss``, ``stsd``). Only the plain layout every mp4 writer
uses for LeRobot's videos (PyAV's and ffmpeg's mov muxer, non-fragmented) is read here; a file using anything that
changes what the demuxer would give (fragments, a shifting edit list, composition offsets, partial sync samples,
sample groups, several sample descriptions, an unknown codec entry, empty samples) gives ``None``, and the caller
demuxes it. The bytes are input from strangers: every size and count is checked against its box and the file, and a
damaged box raises `Mp4Error`, which says where.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

MAX_BOXES = 1 << 16  # boxes in one parent; a real moov has tens
CODECS = {b"av01": ("av1", b"av1C"), b"avc1": ("h264", b"avcC"), b"hvc1": ("hevc", b"hvcC"),
          b"hev1": ("hevc", b"hvcC")}  # sample entry -> (FFmpeg codec, the box FFmpeg keeps as extradata)
_IDENTITY_EDIT = 0x00010000  # an edit list's media rate 1.0 (16.16 fixed point)


class Mp4Error(ValueError):
    """A box of the file is damaged (sizes or counts that do not fit): the message says which."""


@dataclass
class Tables:
    """One video track's packets in decode order (each's time in s, byte position, size, keyframe flag) and its
    decoder setup, as FFmpeg's demuxer reports them."""

    times: np.ndarray
    pos: np.ndarray
    size: np.ndarray
    keys: np.ndarray
    codec: str
    extradata: bytes
    height: int
    width: int
    rate: float


def _boxes(buf: memoryview, start: int, end: int) -> Iterator[tuple[bytes, int, int]]:
    """(type, body start, body end) of each box in ``buf[start:end]``, each checked to lie inside it."""
    pos = start
    for _ in range(MAX_BOXES):
        if pos >= end:
            return
        if end - pos < 8:
            raise Mp4Error(f"a box header at byte {pos} is cut short by its parent's end at {end}")
        size, kind = struct.unpack_from(">I4s", buf, pos)
        head = 8
        if size == 1:
            if end - pos < 16:
                raise Mp4Error(f"box {kind!r} at byte {pos}: its 64-bit size is cut short")
            size, head = struct.unpack_from(">Q", buf, pos + 8)[0], 16
        elif size == 0:
            size = end - pos  # the box runs to its parent's end
        if size < head or size > end - pos:
            raise Mp4Error(f"box {kind!r} at byte {pos} claims {size} bytes, more than the {end - pos} left in its "
                           "parent (or fewer than its header)")
        yield kind, pos + head, pos + size
        pos += size
    raise Mp4Error(f"more than {MAX_BOXES} boxes in one parent before byte {end}")


def _children(buf: memoryview, start: int, end: int) -> dict[bytes, list[tuple[int, int]]]:
    out: dict[bytes, list[tuple[int, int]]] = {}
    for kind, a, b in _boxes(buf, start, end):
        out.setdefault(kind, []).append((a, b))
    return out


def _one(kids: dict[bytes, list[tuple[int, int]]], kind: bytes, where: str) -> tuple[int, int]:
    got = kids.get(kind, [])
    if len(got) != 1:
        raise Mp4Error(f"{where} holds {len(got)} {kind.decode('latin-1')!r} boxes, not one")
    return got[0]


def _full(buf: memoryview, box: tuple[int, int], head: int, entry: int, kind: str) -> tuple[int, int, int]:
    """(version, entry count, first entry's byte) of a full box of ``head`` bytes after version/flags and a count,
    its entries of ``entry`` bytes checked to fit in it."""
    a, b = box
    if b - a < 4 + head:
        raise Mp4Error(f"box {kind!r} at byte {a} holds {b - a} bytes, too few for its header")
    version = buf[a]
    count = struct.unpack_from(">I", buf, a + head)[0] if head else 0
    if entry and count * entry > b - (a + 4 + head):
        raise Mp4Error(f"box {kind!r} at byte {a} lists {count} entries of {entry} bytes in {b - a - 4 - head}")
    return version, count, a + 4 + head


def _array(buf: memoryview, at: int, count: int, dtype: str) -> np.ndarray:
    return np.frombuffer(buf, np.dtype(dtype), count, at).astype(np.int64)


def read_tables(buf: memoryview) -> Tables | None:
    """The first video track of the mp4 whose whole bytes are ``buf``; ``None`` when the file uses what only the
    demuxer reads (see the module docstring). Raises `Mp4Error` when a box is damaged."""
    top = _children(buf, 0, len(buf))
    if b"moof" in top or b"moov" not in top:
        return None  # fragmented, or not an mp4 the tables describe
    moov = _children(buf, *_one(top, b"moov", "the file"))
    if b"mvex" in moov:
        return None
    for trak in moov.get(b"trak", []):
        kids = _children(buf, *trak)
        mdia = _children(buf, *_one(kids, b"mdia", "a trak"))
        ha, hb = _one(mdia, b"hdlr", "a trak's mdia")
        if hb - ha < 12:
            raise Mp4Error(f"box 'hdlr' at byte {ha} holds {hb - ha} bytes, too few")
        if bytes(buf[ha + 8:ha + 12]) == b"vide":
            return _track(buf, kids, mdia)
    return None


def _track(buf: memoryview, trak: dict, mdia: dict) -> Tables | None:
    if not _plain_edits(buf, trak):
        return None
    ma, mb = _one(mdia, b"mdhd", "the video trak's mdia")
    v = buf[ma] if mb > ma else 0
    need = 4 + (20 if v == 1 else 12) + 4
    if mb - ma < need:
        raise Mp4Error(f"box 'mdhd' at byte {ma} holds {mb - ma} bytes, too few")
    scale = struct.unpack_from(">I", buf, ma + 4 + (16 if v == 1 else 8))[0]
    if not scale:
        raise Mp4Error(f"box 'mdhd' at byte {ma} gives a timescale of 0")
    minf = _children(buf, *_one(mdia, b"minf", "the video trak's mdia"))
    stbl = _children(buf, *_one(minf, b"stbl", "the video trak's minf"))
    if any(k in stbl for k in (b"ctts", b"stps", b"sbgp", b"stz2", b"sdtp")) or \
            (b"stco" in stbl) == (b"co64" in stbl):
        return None  # composition offsets, partial sync, sample groups: the demuxer's business
    setup = _setup(buf, _one(stbl, b"stsd", "stbl"))
    if setup is None:
        return None
    _, n, at = _full(buf, _one(stbl, b"stsz", "stbl"), 8, 0, "stsz")
    common = struct.unpack_from(">I", buf, at - 8)[0]
    if common:  # one size for every sample: the count has no table to bound it, the file does
        if n * common > len(buf):
            raise Mp4Error(f"box 'stsz' lists {n} samples of {common} bytes, more than the file's {len(buf)}")
        size = np.full(n, common, np.int64)
    else:
        _full(buf, _one(stbl, b"stsz", "stbl"), 8, 4, "stsz")
        size = _array(buf, at, n, ">u4")
    if not n or not size.all():
        return None  # empty samples: the demuxer skips them
    big = b"co64" in stbl
    _, nchunks, at = _full(buf, _one(stbl, b"co64" if big else b"stco", "stbl"), 4, 8 if big else 4, "stco")
    offsets = _array(buf, at, nchunks, ">u8" if big else ">u4")
    _, ne, at = _full(buf, _one(stbl, b"stsc", "stbl"), 4, 12, "stsc")
    stsc = _array(buf, at, 3 * ne, ">u4").reshape(ne, 3)
    if not ne or stsc[0, 0] != 1 or (np.diff(stsc[:, 0]) <= 0).any() or stsc[-1, 0] > nchunks or \
            (stsc[:, 2] != 1).any():
        return None  # chunk runs out of order or past the chunk table: let the demuxer judge them
    runs = np.diff(np.append(stsc[:, 0], nchunks + 1))
    per_chunk = np.repeat(stsc[:, 1], runs)
    if int(per_chunk.sum()) != n:
        raise Mp4Error(f"the chunk table holds {int(per_chunk.sum())} samples, the size table {n}")
    chunk = np.repeat(np.arange(nchunks), per_chunk)
    ends = np.cumsum(size)
    first = np.cumsum(per_chunk) - per_chunk  # each chunk's first sample
    pos = offsets[chunk] + (ends - size) - (ends - size)[first][chunk]
    if (pos + size > len(buf)).any():
        raise Mp4Error(f"a sample lies past the file's end ({len(buf)} bytes)")
    _, ne, at = _full(buf, _one(stbl, b"stts", "stbl"), 4, 8, "stts")
    stts = _array(buf, at, 2 * ne, ">u4").reshape(ne, 2)
    if int(stts[:, 0].sum()) != n or (stts[:, 1] == 0).any():
        return None  # times that do not cover the samples one by one
    dts = np.cumsum(np.repeat(stts[:, 1], stts[:, 0])) - np.repeat(stts[:, 1], stts[:, 0])
    keys = np.ones(n, bool)
    if b"stss" in stbl:
        _, ns, at = _full(buf, _one(stbl, b"stss", "stbl"), 4, 4, "stss")
        sync = _array(buf, at, ns, ">u4")
        if not ns or (sync < 1).any() or (sync > n).any():
            return None
        keys[:] = False
        keys[sync - 1] = True
    rate = scale * n / int(stts[:, 0] @ stts[:, 1])
    return Tables(dts * (1 / scale), pos, size, keys, *setup, rate)  # as the demuxer: pts times a float time base


def _plain_edits(buf: memoryview, trak: dict) -> bool:
    """No edit list, or one that shows the media from its start at rate 1 (what shifts no time)."""
    if b"edts" not in trak:
        return True
    edts = _children(buf, *_one(trak, b"edts", "the video trak"))
    if b"elst" not in edts:
        return True
    box = _one(edts, b"elst", "edts")
    v = buf[box[0]] if box[1] > box[0] else 0
    entry = 20 if v == 1 else 12
    _, n, at = _full(buf, box, 4, entry, "elst")
    if n != 1:
        return False
    media, rate = struct.unpack_from(">qI" if v == 1 else ">iI", buf, at + (8 if v == 1 else 4))
    return media == 0 and rate == _IDENTITY_EDIT


def _setup(buf: memoryview, stsd: tuple[int, int]) -> tuple[str, bytes, int, int] | None:
    """(codec, extradata, height, width) of the one sample description, as FFmpeg fills its codec context."""
    _, n, at = _full(buf, stsd, 4, 0, "stsd")
    if n != 1:
        return None
    entries = list(_boxes(buf, at, stsd[1]))
    if len(entries) != 1:
        return None
    kind, a, b = entries[0]
    if kind not in CODECS or b - a < 78:
        return None
    codec, conf = CODECS[kind]
    width, height = struct.unpack_from(">HH", buf, a + 24)
    kids = _children(buf, a + 78, b)
    if len(kids.get(conf, [])) != 1:
        return None
    ca, cb = kids[conf][0]
    return codec, bytes(buf[ca:cb]), height, width


__all__ = ["Mp4Error", "Tables", "read_tables"]
