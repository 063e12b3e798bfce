"""Read one frame's tar members from its byte range, all of them or only some.

The index gives each frame's byte range, not each member's. A frame read whole costs one read; a
frame read for a few members (an array window, say) walks its 512-byte headers and reads only the
wanted members' data, so a ``state`` history never reads the JPEGs beside it.
"""

from __future__ import annotations

import tarfile
from collections.abc import Callable

from episodepipes.format import BLOCK, sample_key

Pread = Callable[[int, int], bytes | memoryview]  # (size, offset) -> bytes


def _header(buf: bytes, where: str, offset: int) -> tuple[str, int, bytes]:
    """(name, size, type) of a tar header block; plain octal fields parsed directly, the rest by tarfile."""
    buf = bytes(buf)  # a block of a mapped shard comes as a memoryview
    size_field = buf[124:136]
    got = None
    if len(buf) == BLOCK and buf[257:262] == b"ustar" and size_field[:1] != b"\x80":
        try:
            got = buf[:100].split(b"\0", 1)[0].decode("utf-8", "surrogateescape"), \
                int(size_field.split(b"\0", 1)[0].strip() or b"0", 8), buf[156:157]
        except ValueError:
            pass
    if got is None:
        try:
            info = tarfile.TarInfo.frombuf(buf, "utf-8", "surrogateescape")
        except tarfile.HeaderError as e:
            raise ValueError(f"{where}: no valid tar header at byte {offset} ({e}); the shard does not match its "
                             "index, re-shard it or check with verify=True") from None
        got = info.name, info.size, info.type
    if got[1] < 0:  # int() and tarfile's base-256 both take a sign; no writer stores one
        raise ValueError(f"{where}: the tar header at byte {offset} gives member {got[0]!r} a negative size "
                         f"({got[1]}); the shard does not match its index, re-shard it or check with verify=True")
    return got


def _padded(size: int) -> int:
    return -(-size // BLOCK) * BLOCK


def frame_fields(pread: Pread, start: int, end: int, episode: str, frame: int, want: set[str] | None = None, *,
                 where: str = "shard") -> tuple[dict[str, bytes], int]:
    """({field: bytes}, bytes read) of one frame's members in ``[start, end)``; only ``want`` fields if given.

    Fields are what follows ``<episode>/<frame:06d>.`` in a member name (``front.jpg``, ``state.npy``, ``json``).
    """
    prefix = sample_key(episode, frame) + "."
    whole = want is None
    buf = pread(end - start, start) if whole else b""
    nread = len(buf)
    if whole and len(buf) != end - start:
        raise ValueError(f"{where} ends before byte {end}, where the index expects frame {prefix[:-1]!r}: "
                         "truncated? re-shard it or check with verify=True")
    out: dict[str, bytes] = {}
    pos, long_name = start, None
    while pos < end and (whole or len(out) < len(want or ())):
        hdr = buf[pos - start:pos - start + BLOCK] if whole else pread(BLOCK, pos)
        nread += 0 if whole else len(hdr)
        name, size, kind = _header(hdr, where, pos)
        data_at, pos = pos + BLOCK, pos + BLOCK + _padded(size)
        name, long_name = long_name or name, None
        if kind == tarfile.GNUTYPE_LONGNAME:  # the next member's name, longer than 100 bytes
            raw = buf[data_at - start:data_at - start + size] if whole else pread(size, data_at)
            nread += 0 if whole else len(raw)
            long_name = bytes(raw).rstrip(b"\0").decode("utf-8", "surrogateescape")
            continue
        if not name.startswith(prefix):
            raise ValueError(f"{where}: member {name!r} at byte {data_at - BLOCK} is not in frame {prefix[:-1]!r}; "
                             "the shard does not match its index, re-shard it or check with verify=True")
        field = name[len(prefix):]
        if whole:
            out[field] = buf[data_at - start:data_at - start + size]
        elif field in want:  # type: ignore[operator]
            out[field] = pread(size, data_at)
            nread += len(out[field])
    missing = sorted(set(want or ()) - set(out))
    if missing:
        raise ValueError(f"{where}: frame {prefix[:-1]!r} has no member(s) {missing}; re-shard it")
    return out, nread
