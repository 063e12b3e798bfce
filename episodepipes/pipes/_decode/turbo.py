"""JPEG frames through libjpeg-turbo directly (simplejpeg), with OpenCV's pixels.

``cv2.imdecode`` spends a quarter of a 224x224 decode around libjpeg-turbo (its codec registry, EXIF parse and a
fresh output Mat); simplejpeg calls the same library's decompressor into a buffer we give it. With the same
settings (slow integer DCT, fancy upsampling, scale 1/f) the pixels are OpenCV's bit for bit
(tests/pipes/test_decode_turbo.py holds it on real footage, reduced scales included). Where they might not be, this
gives up and `episodepipes.pipes.frames` takes ``cv2.imdecode`` as before: an EXIF segment (OpenCV turns the image as
its orientation says; simplejpeg does not), a PNG, or anything libjpeg-turbo only warns about (a frame cut short,
extraneous bytes): ``strict=True`` makes those an error here, and OpenCV's handling of them stays the answer.
"""

from __future__ import annotations

import threading

import numpy as np

try:
    import simplejpeg
except ImportError:  # the library still decodes, through cv2.imdecode only
    simplejpeg = None

_APP1 = 0xE1
_EXIF = b"Exif\x00\x00"
_local = threading.local()


def available() -> bool:
    """Whether simplejpeg is installed (a dependency of the library; a missing one means cv2 for every frame)."""
    return simplejpeg is not None


def has_exif(data: bytes | memoryview) -> bool:
    """Whether the JPEG's application segments (those right after SOI) hold an EXIF one: its orientation is applied
    by ``cv2.imdecode`` only. A walk over a few segment lengths, nothing copied."""
    i, n = 2, len(data)
    while i + 4 <= n and data[i] == 0xFF:
        marker = data[i + 1]
        if marker == 0xFF:
            i += 1
            continue
        if not (0xE0 <= marker <= 0xEF or marker == 0xFE):  # past APPn / COM: no EXIF before the tables
            return False
        length = (data[i + 2] << 8) | data[i + 3]
        if marker == _APP1 and bytes(data[i + 4:i + 10]) == _EXIF:
            return True
        i += 2 + length
    return False


def _scratch(nbytes: int) -> np.ndarray:
    """This thread's output buffer, grown to ``nbytes``: a fresh ~1 MB array per frame costs an mmap and its page
    faults (glibc serves large blocks that way), the decode itself not much more at 224x224."""
    buf = getattr(_local, "buf", None)
    if buf is None or buf.size < nbytes:
        buf = _local.buf = np.empty(nbytes, np.uint8)
    return buf


def decode_rgb(data: bytes | memoryview, head: tuple[int, int], factor: int) -> np.ndarray | None:
    """RGB ``[H/f, W/f, 3]`` of a JPEG whose header declares ``head`` (H, W), scaled by libjpeg's 1/``factor``
    (sizes rounded up, as ``IMREAD_REDUCED_COLOR_<f>`` does), in this thread's scratch buffer (valid until its next
    call); None where OpenCV's pixels are not certain (no simplejpeg, EXIF, not a JPEG, any libjpeg warning)."""
    if simplejpeg is None or data[:2] != b"\xff\xd8" or has_exif(data):
        return None
    h, w = -(-head[0] // factor), -(-head[1] // factor)
    try:
        img = simplejpeg.decode_jpeg(data, colorspace="RGB", min_factor=factor, min_height=h, min_width=w,
                                     buffer=_scratch(h * w * 3), strict=True)
    except (ValueError, TypeError, RuntimeError):  # damaged or unusual data: cv2.imdecode decides, as it always did
        return None
    return img if img.shape == (h, w, 3) else None
