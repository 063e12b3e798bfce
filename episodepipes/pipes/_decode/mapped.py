"""Local shards mapped read-only for `TrainReader`: a frame's bytes are a slice of the mapping.

Why not ``os.pread``: the read itself is cheap, but every call releases the GIL, and the thread that
reads samples (the one feeding the decode workers) then waits to get it back behind the decode threads'
Python, once per read; a window of 16 array steps makes dozens of reads per sample. A slice of a mapping
makes no call and copies nothing; the decoder reads the JPEG straight from the page cache.

Decode processes get no slices (a memoryview does not pickle) but `ShardSlice` references, which they
resolve against mappings of their own (`resolve`): the frame's bytes never go through a pipe, and are
never copied in the parent. A sample of such references travels as plain tuples (`to_wire`, `from_wire`).

A mapping is dropped by `MappedShards.close` (the samples still holding slices keep theirs alive until
they are gone). A range past the end of a file goes to the byte source, which raises its "truncated"
error naming the file. The shards must not shrink while mapped: finished shards never change in place
(they are written as ``.tmp`` and renamed), and a file cut short under a running reader would fault.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections import OrderedDict
from typing import NamedTuple

from episodepipes.format import BLOCK
from episodepipes.pipes.plan import Item
from episodepipes.pipes.sample import RawSample
from episodepipes.shardio import LocalSource, ShardIOError, open_regular

_USTAR = struct.Struct("100s24x12s20xc100x5s")  # name, size, type, magic of a tar header, read in place
MAX_MAPS = 64  # shards a decode process keeps mapped (`resolve`)
_MAPS: OrderedDict[str, memoryview] = OrderedDict()
_CACHED = 4096  # distinct tar size fields and member names `frame_members` keeps parsed (a dataset has few)
_SIZES: dict[bytes, int] = {}
_FIELDS: dict[bytes, str] = {}


class ShardSlice(NamedTuple):
    """``size`` bytes at ``offset`` of the shard file at ``path``: what a decode process maps itself."""

    path: str
    offset: int
    size: int


class MappedShards:
    """``read(name, offset, size)`` of `LocalSource`, as memoryviews of mappings made on first use."""

    def __init__(self, source: LocalSource) -> None:
        self.source = source
        self._maps: dict[str, memoryview] = {}

    def read(self, name: str, offset: int, size: int) -> memoryview | bytes:
        view = self._maps.get(name)
        if view is None:
            view = self._map(name)
        if offset < 0 or size < 0 or offset + size > len(view):
            return self.source.read(name, offset, size)  # its error names the file and the range
        return view[offset:offset + size]

    def frame(self, name: str, start: int, end: int) -> memoryview | None:
        """The mapped bytes ``[start, end)`` of shard ``name``, or None where the file is shorter (the caller
        then reads through `read`, whose error names the file)."""
        view = self._maps.get(name)
        if view is None:
            view = self._map(name)
        return view[start:end] if 0 <= start <= end <= len(view) else None

    def _map(self, name: str) -> memoryview:
        size = self.source.size(name)  # a missing file is the source's error
        if size == 0:
            view = memoryview(b"")
        else:
            # the source's own descriptor, checked to be a regular file: a FIFO opened again by name would block
            view = memoryview(mmap.mmap(self.source.fileno(name), size, access=mmap.ACCESS_READ))
        self._maps[name] = view
        return view

    def close(self) -> None:
        """Forget the mappings (each is unmapped once no slice of it is left)."""
        self._maps = {}


def frame_members(buf: memoryview, prefix: bytes,
                  want: set[str] | None = None) -> tuple[dict[str, tuple[int, int]], int] | None:
    """({field: (start, end) in ``buf``}, bytes a read of them takes) of one frame's plain ustar members, all
    named ``prefix + field``; only ``want`` fields if given (walking headers until all are found, as
    `tarmembers.frame_fields` reads them). None for anything else (a long name, a binary size, another name,
    a member past the frame, a wanted field missing): `tarmembers.frame_fields` then says what is wrong.

    The reader's per-frame hot path: the headers are parsed in place, with no per-member read or copy.
    """
    out: dict[str, tuple[int, int]] = {}
    end, pos, n, plen = len(buf), 0, 0, len(prefix)
    left = len(want) if want is not None else -1
    while pos < end and left != 0:
        if end - pos < BLOCK:
            return None
        name, size_field, kind, magic = _USTAR.unpack_from(buf, pos)
        if magic != b"ustar" or kind not in b"0\0" or size_field[0] == 0x80 or not name.startswith(prefix):
            return None
        size = _SIZES.get(size_field)
        field = _FIELDS.get(tail := name[plen:])
        if size is None or field is None:  # parsed once per distinct header field, then looked up
            try:
                size = int(size_field.split(b"\0", 1)[0].strip() or b"0", 8)
                field = tail.split(b"\0", 1)[0].decode("utf-8")
            except ValueError:
                return None
            for cache, k, v in ((_SIZES, size_field, size), (_FIELDS, tail, field)):
                if len(cache) >= _CACHED:
                    cache.clear()
                cache[k] = v  # type: ignore[index]
        data = pos + BLOCK
        pos = data + -(-size // BLOCK) * BLOCK
        if size < 0 or data + size > end or field in out:  # int() takes a sign: "-1" is no tar size
            return None
        n += BLOCK
        if want is None:
            out[field] = (data, data + size)
        elif field in want:
            out[field] = (data, data + size)
            n += size
            left -= 1
    if left > 0:
        return None
    return out, end if want is None else n


def resolve(s: ShardSlice) -> memoryview:
    """In a decode process: the bytes ``s`` names, a slice of this process's mapping of its shard."""
    return _slice(_mapping(s.path), s.path, s.offset, s.size)


def _mapping(path: str) -> memoryview:
    """This process's mapping of the shard file at ``path`` (the last `MAX_MAPS` kept)."""
    view = _MAPS.get(path)
    if view is None:
        fd, st = open_regular(path, "put the shard back (it was replaced while the pass ran)", ShardIOError)
        try:
            size = st.st_size
            view = memoryview(mmap.mmap(fd, size, access=mmap.ACCESS_READ)) if size else memoryview(b"")
        finally:
            os.close(fd)
        _MAPS[path] = view
        while len(_MAPS) > MAX_MAPS:
            _MAPS.popitem(last=False)
    else:
        _MAPS.move_to_end(path)
    return view


def _slice(view: memoryview, path: str, offset: int, size: int) -> memoryview:
    if offset + size > len(view):
        raise ValueError(f"{path} ends before byte {offset + size}, where its index puts a frame: truncated "
                         "while reading? re-shard it or check with verify=True")
    return view[offset:offset + size]

Wire = tuple  # (episode, frame, valid, shard, path, fields, spans, checks): see `to_wire`


def to_wire(raw: RawSample) -> Wire | None:
    """A sample whose members and crc32 checks are all `ShardSlice` references into one shard file, as plain
    tuples for a decode process: ``(episode, frame, valid, shard, path, fields, (offset, size) per field,
    ((step, offset, size, crc32), ...))``; None for any other sample (windows, borrowed frames, damage, bytes).

    A pickled `RawSample` reduces through copyreg (a dataclass, its `Item` and a named tuple per member):
    tens of microseconds a sample, in the parent and again in the worker; tuples of str and int cost a few."""
    if type(raw) is not RawSample or raw.windows or raw.borrowed or raw.damaged is not None or not raw.members:
        return None
    path = None
    spans: list[int] = []
    for v in raw.members.values():
        if type(v) is not ShardSlice or (path is not None and v.path != path):
            return None
        path = v.path
        spans += v.offset, v.size
    checks = []
    for step, d, crc in raw.checks:
        if type(d) is not ShardSlice or d.path != path:
            return None
        checks.append((step, d.offset, d.size, crc))
    item = raw.item
    return item.episode, item.frame, item.valid, raw.shard, path, tuple(raw.members), tuple(spans), tuple(checks)


def from_wire(wire: Wire) -> RawSample:
    """In a decode process: the `RawSample` `to_wire` sent, its references resolved to this process's mappings."""
    episode, frame, valid, shard, path, fields, spans, checks = wire
    view = _mapping(path)  # one shard: looked up once, not per member
    members = {f: _slice(view, path, spans[2 * i], spans[2 * i + 1]) for i, f in enumerate(fields)}
    return RawSample(Item(episode, frame, valid), shard, members,  # type: ignore[arg-type]
                     checks=tuple((s, _slice(view, path, a, n), c) for s, a, n, c in checks))
