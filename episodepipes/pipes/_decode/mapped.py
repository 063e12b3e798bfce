"""A local shard's frames for the readers: slices of a mapping of the shard held under a read lease, or where no
lease is granted, one checked ``pread`` per frame (or run of frames).

A bare mapping is unsafe: a shard cut short in place while a pass reads it (``cp`` over it, ``rsync --inplace``, a
truncate) turns the next touch of a mapped page past the new end into SIGBUS, which kills the process from inside C
code (the decoder, zlib) with no message, and Python cannot catch it. Under a read lease (`leases`) the writer waits
until the mapping is out of its way (slices still held keep the bytes they showed), and the reads after it are preads.
A read that comes back short is `ShardTruncatedError` naming the file; bytes rewritten in place fail the frame's CRC32
(``valid=False``). Where there is no lease (another user's file, a filesystem without leases, ``lease=False``), a
frame is one ``pread`` (tens of KB, from the page cache) into the free end of an arena
(`ARENA` bytes, not zeroed; the samples hold slices of it until their decode ends, and an arena is reused once the
last is gone, never overwritten while one is held), made through ``ctypes.PyDLL``, which keeps the GIL: ``os.pread``
releases it, and the thread that reads samples (the one feeding the decode threads) then waited to get it back behind
the decode threads' Python once per frame. A window step wanted for its arrays only reads those members, once
(`ShardFrames.members`): not the whole frame, whose JPEGs a mapping never touched.

Decode processes get no slices (a memoryview does not pickle) but `ShardSlice` references, which they read
themselves (`resolve`) through descriptors of their own: the frame's bytes never go through a pipe. A sample of
such references travels as plain tuples (`to_wire`, `from_wire`).
"""

from __future__ import annotations

import ctypes
import os
import struct
import sys
import weakref
from collections import OrderedDict
from typing import NamedTuple

import numpy as np

from episodepipes.format import BLOCK
from episodepipes.pipes._decode.leases import Lease, lease, retire
from episodepipes.pipes.plan import Item
from episodepipes.pipes.sample import RawSample
from episodepipes.shardio import LocalSource, ShardIOError, open_regular, pread_exact

_USTAR = struct.Struct("100s24x12s20xc100x5s")  # name, size, type, magic of a tar header, read in place
MAX_OPEN = 64  # shards a decode process keeps open (`resolve`)
_FDS: OrderedDict[str, int] = OrderedDict()
_CACHED = 4096  # distinct tar size fields and member names `frame_members` keeps parsed (a dataset has few)
_SIZES: dict[bytes, int] = {}
KEPT = 32 << 20  # bytes of wanted members `ShardFrames.members` keeps (then it starts afresh)
HEAD = 2048  # bytes of a frame read at a time where only some of its members are wanted (`ShardFrames.members`)
SPARES = 16  # earlier arenas `ShardFrames` keeps for reuse (the frames of a few batches in flight)
LEASED = 256  # shards `ShardFrames` maps under a lease at once (then it preads the others)
_UNSEEN = object()
ARENA = 1 << 20  # bytes of frames read into one buffer (`ShardFrames.frame`); a larger read gets its own
try:  # libc's pread, called with the GIL held (PyDLL): a page-cache read of a frame is microseconds
    _PREAD = ctypes.PyDLL(None, use_errno=True).pread
    _PREAD.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int64)
    _PREAD.restype = ctypes.c_ssize_t
except (OSError, AttributeError):  # no libc pread here: os.pread (which releases the GIL) below
    _PREAD = None
_FIELDS: dict[bytes, str] = {}


class ShardSlice(NamedTuple):
    """``size`` bytes at ``offset`` of the shard file at ``path``: what a decode process maps itself."""

    path: str
    offset: int
    size: int


class ShardFrames:
    """A `LocalSource`'s frames as memoryviews: of a shard's leased mapping, else of arenas they were read into (one
    ``pread`` each, its length checked; the module docstring says why the GIL is kept). Used by the one thread that
    reads a pass's samples; ``lease=False`` reads every frame with preads."""

    def __init__(self, source: LocalSource, *, lease: bool = True) -> None:
        self.source = source
        self._leases: dict[str, Lease | None] = {}  # a shard's mapping under a read lease, or None: preads
        self._leasing = lease
        weakref.finalize(self, _retire, self._leases)
        self._view = memoryview(bytearray(0))
        self._arena: np.ndarray | None = None  # the arena `_view` shows
        self._kept: dict[tuple[str, int, bytes], tuple[dict[str, tuple[int, bytes]], int]] = {}  # `members`' answers
        self._held = 0  # bytes `_kept` holds (as `members` counts them: headers included)
        self._spare: list[np.ndarray] = []  # earlier arenas, reused once no slice of them is held (`_fresh`)
        self._base = 0  # the arena's address
        self._free = 0  # the arena's first byte no slice was handed out of

    def read(self, name: str, offset: int, size: int) -> memoryview:
        """``size`` bytes at ``offset``; `ShardTruncatedError` naming the file where it has fewer."""
        return self.frame(name, offset, offset + size)

    def frame(self, name: str, start: int, end: int) -> memoryview:
        """The bytes ``[start, end)`` of shard ``name`` (a frame, or a run of them)."""
        held = self._leases.get(name, _UNSEEN)
        if held is _UNSEEN:
            held = self._lease(name)
        if held is not None:
            view = held.view  # None once the lease breaks (a writer is waiting): preads from then on
            if view is not None and 0 <= start < end <= len(view):
                return view[start:end]
        size = end - start
        if _PREAD is None or size <= 0 or start < 0:
            return memoryview(self.source.read(name, start, size))
        if size > len(self._view) - self._free:
            if size > ARENA // 4:  # a run of frames: its own buffer, the arena kept for the next frames
                return self._into(np.empty(size, np.uint8), name, start)
            arena = self._fresh()
            self._view, self._base, self._free = memoryview(arena), arena.ctypes.data, 0
        a = self._free
        got = self._view[a:a + size]
        if _PREAD(self.source.fileno(name), self._base + a, size, start) != size:
            self._again(name, start, got)
        self._free = a + size
        return got

    def _lease(self, name: str) -> Lease | None:
        """Shard ``name`` mapped under a read lease (`leases`), if this reader takes leases and one is granted
        (at most `LEASED` shards: a file descriptor and a mapping each); None otherwise."""
        fd = self.source.fileno(name)
        held = None
        if self._leasing and sum(v is not None for v in self._leases.values()) < LEASED:
            held = lease(fd)
        self._leases[name] = held
        return held

    def _fresh(self) -> np.ndarray:
        """An arena to read into, not zeroed (a bytearray would be: every byte handed out is read first): a spare
        one no slice is held of any more, else a new one. The old arena lives on in the slices still held and joins
        the spares. Reusing its pages matters: malloc gives a freed MiB back to the kernel, and faulting a new one in
        page by page cost as much again as the reads into it."""
        if self._arena is not None:
            self._spare.append(self._arena)
        self._view = memoryview(bytearray(0))  # the old arena's last reference here besides the spares
        spare = self._spare
        for i in range(len(spare)):
            if sys.getrefcount(spare[i]) == 2:  # the list's and the argument's: no memoryview of it is left anywhere
                self._arena = spare.pop(i)
                return self._arena
        if len(self._spare) > SPARES:  # slices held long: let the oldest go with them
            del self._spare[0]
        self._arena = np.empty(ARENA, np.uint8)
        return self._arena

    def members(self, name: str, start: int, end: int, prefix: bytes,
                want: set[str]) -> tuple[dict[str, tuple[int, bytes]], int] | None:
        """Only the ``want`` members of the frame ``[start, end)`` of shard ``name``: ({field: (its offset in the
        shard, a copy of its bytes)}, bytes a read of them takes, as `frame_members` counts), its headers walked in
        reads of `HEAD` bytes. None where `frame_members` gives None.

        A window step read for an array takes a KB or two of its frame instead of the whole frame with its JPEGs
        (what the mapping this replaced touched); and as each step is a step of the windows of the samples around
        it, its members are kept (up to `KEPT` bytes, a KB or so a frame) and read once, as the mapping
        read its page once. A frame changed in place is still found out by the reads of whole frames."""
        key = (name, start, prefix)
        kept = self._kept.get(key)
        if kept is not None and want <= kept[0].keys():
            return kept
        out: dict[str, tuple[int, bytes]] = {}
        pos, n, left = start, 0, len(want)
        while pos < end and left:
            view = self.frame(name, pos, min(end, pos + HEAD))
            off, have = 0, len(view)
            while left and off + BLOCK <= have:
                got = _member(view, off, prefix)
                if got is None:
                    return None
                field, size = got
                data = off + BLOCK
                if pos + data + size > end or field in out:
                    return None
                n += BLOCK
                if field in want:
                    body = view[data:data + size] if data + size <= have else self.read(name, pos + data, size)
                    out[field] = (pos + data, bytes(body))
                    n += size
                    left -= 1
                off = data + -(-size // BLOCK) * BLOCK
            if left and off < have and pos + have == end:  # a header cut by the frame's end
                return None
            pos += off
        if left:
            return None
        self._held += n
        if self._held > KEPT:
            self._kept.clear()
            self._held = n
        self._kept[key] = (out, n)
        return out, n

    def _into(self, buf: np.ndarray, name: str, start: int) -> memoryview:
        view = memoryview(buf)
        if _PREAD(self.source.fileno(name), buf.ctypes.data, len(buf), start) != len(buf):
            self._again(name, start, view)
        return view

    def _again(self, name: str, start: int, into: memoryview) -> None:
        """A read that came back short or failed, made again by `LocalSource.read`: its errors name the file
        (`ShardTruncatedError` where it is short), and a read interrupted by a signal succeeds there."""
        into[:] = self.source.read(name, start, len(into))


def _retire(leases: dict[str, Lease | None]) -> None:
    retire([v for v in leases.values() if v is not None])


def _member(buf: memoryview, pos: int, prefix: bytes) -> tuple[str, int] | None:
    """(field, size) of the plain ustar header at ``pos`` of ``buf`` (``pos + BLOCK <= len(buf)``) named ``prefix +
    field``; None for anything else (a long name, a binary size, another name)."""
    name, size_field, kind, magic = _USTAR.unpack_from(buf, pos)
    if magic != b"ustar" or kind not in b"0\0" or size_field[0] == 0x80 or not name.startswith(prefix):
        return None
    size = _SIZES.get(size_field)
    field = _FIELDS.get(tail := name[len(prefix):])
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
    return (field, size) if size >= 0 else None  # int() takes a sign: "-1" is no tar size


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
        # `_member`, inlined: a call per member is a third of this function's time, and every frame comes here
        name, size_field, kind, magic = _USTAR.unpack_from(buf, pos)
        if magic != b"ustar" or kind not in b"0\0" or size_field[0] == 0x80 or not name.startswith(prefix):
            return None
        size = _SIZES.get(size_field)
        field = _FIELDS.get(name[plen:])
        if size is None or field is None:
            got = _member(buf, pos, prefix)
            if got is None:
                return None
            field, size = got
        data = pos + BLOCK
        pos = data + -(-size // BLOCK) * BLOCK
        if size < 0 or data + size > end or field in out:
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
    """In a decode process: the bytes ``s`` names, read through this process's descriptor of its shard."""
    return memoryview(_pread(s.path, s.offset, s.size))


def _fd(path: str) -> int:
    """This process's descriptor of the shard file at ``path`` (the last `MAX_OPEN` kept open)."""
    fd = _FDS.get(path)
    if fd is None:
        fd, _ = open_regular(path, "put the shard back (it was replaced while the pass ran)", ShardIOError)
        _FDS[path] = fd
        while len(_FDS) > MAX_OPEN:
            os.close(_FDS.popitem(last=False)[1])
    else:
        _FDS.move_to_end(path)
    return fd


def _pread(path: str, offset: int, size: int) -> bytes:
    return pread_exact(_fd(path), size, offset, path)

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
    """In a decode process: the `RawSample` `to_wire` sent, its references read in one ``pread`` of their span."""
    episode, frame, valid, shard, path, fields, spans, checks = wire
    lo = min([*spans[::2], *(a for _, a, _, _ in checks)])
    hi = max([*(a + n for a, n in zip(spans[::2], spans[1::2])), *(a + n for _, a, n, _ in checks)])
    view = memoryview(_pread(path, lo, hi - lo))  # a frame: its members and its whole bytes for the crc32
    members = {f: view[spans[2 * i] - lo:spans[2 * i] - lo + spans[2 * i + 1]] for i, f in enumerate(fields)}
    return RawSample(Item(episode, frame, valid), shard, members,  # type: ignore[arg-type]
                     checks=tuple((s, view[a - lo:a - lo + n], c) for s, a, n, c in checks))
