"""Frame images (PNG, JPEG) checked by their own header before they are read whole or decoded.

An image file is a stranger's: a few hundred bytes of PNG or JPEG may declare 30000 x 30000 pixels, which OpenCV
allocates (2.7 GB) before it finds the data missing, and a sparse frame file costs no disk however large it says it
is. So a frame file is refused by its size before it is read (`MAX_IMAGE_BYTES`), and its header (PNG's IHDR, JPEG's
SOFn) by its sides (at most 65500, JPEG's and the index's limit), its pixel count (`MAX_PIXELS`) and, from the second
frame of a camera on, by differing from the first frame's size (a camera's frames share one size in the index).
The decoder only ever sees bytes that passed. Other image formats (OpenCV would decode BMP, TIFF, WebP... by their
content, whatever the file's name) are refused: the readers take PNG and JPEG frames only.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

from episodepipes.sharding.episode import EpisodeError
from episodepipes.shardio import open_regular

MAX_SIDE = 65500  # libjpeg's limit, which the index also holds every camera to (sharding.write.plan.JPEG_MAX)
MAX_PIXELS = 1 << 26  # 8192 x 8192 (as codec.stream.MAX_SIDE for videos): 192 MiB decoded as BGR
MAX_IMAGE_BYTES = 1 << 28  # above an uncompressed 8-bit 8192 x 8192 RGB PNG; a frame file is KB to a few MB
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


def check_header(data: bytes | memoryview, what: str, first: tuple[int, int] | None, i: int) -> tuple[int, int]:
    """The (height, width) of frame ``i``'s image bytes, refused by an `EpisodeError` naming ``what`` unless its
    header is PNG or JPEG, within `MAX_SIDE` a side and `MAX_PIXELS`, and the size of the camera's ``first`` frame."""
    size = header_size(data)
    if size is None:
        raise EpisodeError(f"{what} is not a decodable image (no PNG or JPEG header); replace or delete the file, "
                           "or pass --skip-bad")
    h, w = size
    if not (0 < h <= MAX_SIDE and 0 < w <= MAX_SIDE) or h * w > MAX_PIXELS:
        raise EpisodeError(f"{what} declares {h}x{w} pixels, beyond {MAX_SIDE} a side or {MAX_PIXELS} pixels in all "
                           "(a damaged or hostile header); resize or replace the file")
    if first is not None and size != first:
        raise EpisodeError(f"{what}: frame {i} is {size}, frame 0 was {first}; a camera's frames must share one "
                           "size: resize or remove that file")
    return size


def read_image(path: Path, what: str) -> bytes:
    """The bytes of the regular file ``path``, refused (naming ``what``) if it holds more than `MAX_IMAGE_BYTES`;
    its size is checked before any byte is read."""
    fd, st = open_regular(path, "replace it with the frame's image", EpisodeError)
    with os.fdopen(fd, "rb") as f:
        if st.st_size > MAX_IMAGE_BYTES:
            raise EpisodeError(f"{what} holds {st.st_size} bytes, more than the {MAX_IMAGE_BYTES} a frame image may; "
                               "replace or delete the file")
        data = f.read(MAX_IMAGE_BYTES + 1)
    if len(data) > MAX_IMAGE_BYTES:  # it grew since it was opened
        raise EpisodeError(f"{what} holds more than the {MAX_IMAGE_BYTES} bytes a frame image may; replace the file")
    return data
