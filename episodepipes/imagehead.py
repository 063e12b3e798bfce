"""The size a PNG or JPEG declares in its header, read before anything decodes it.

A few hundred bytes of PNG or JPEG may declare 30000 x 30000 pixels, which OpenCV allocates (2.7 GB) before it
finds the data missing. So the writer (`episodepipes.sharding.formats.imagehead`) and the readers
(`episodepipes.pipes.frames`) check this header first: it is PNG's IHDR, or a JPEG's first SOFn after the
segments before it, found by their lengths alone (a few of them, microseconds per frame, nothing allocated).
"""

from __future__ import annotations

import struct

_PNG = b"\x89PNG\r\n\x1a\n"
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}  # start-of-frame markers (DHT, JPG and DAC are not)
_ALONE = frozenset([0x01, *range(0xD0, 0xD8)])  # markers without a length field (TEM, RSTn)


def header_size(data: bytes | memoryview) -> tuple[int, int] | None:
    """(height, width) a PNG's IHDR or a JPEG's first SOFn declares, or None if ``data`` is neither (or is cut
    before its header ends)."""
    if data[:8] == _PNG:
        if len(data) < 24 or data[12:16] != b"IHDR":
            return None
        w, h = struct.unpack_from(">II", data, 16)
        return h, w
    if data[:2] != b"\xff\xd8":
        return None
    i = 2
    while i + 4 <= len(data):
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte before a marker
            i += 1
            continue
        if marker in _ALONE:
            i += 2
            continue
        if marker in (0xD9, 0xDA):  # the end, or the scan, before any frame header
            return None
        if marker in _SOF:
            return struct.unpack_from(">HH", data, i + 5) if i + 9 <= len(data) else None
        i += 2 + struct.unpack_from(">H", data, i + 2)[0]
    return None
