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
from pathlib import Path

from episodepipes.imagehead import header_size
from episodepipes.sharding.episode import EpisodeError
from episodepipes.shardio import open_regular

MAX_SIDE = 65500  # libjpeg's limit, which the index also holds every camera to (sharding.write.plan.JPEG_MAX)
MAX_PIXELS = 1 << 26  # 8192 x 8192 (as codec.stream.MAX_SIDE for videos): 192 MiB decoded as BGR
MAX_IMAGE_BYTES = 1 << 28  # above an uncompressed 8-bit 8192 x 8192 RGB PNG; a frame file is KB to a few MB
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
