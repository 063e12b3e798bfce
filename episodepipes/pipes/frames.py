"""Frame decoders: a camera's stored frame member to a uint8 RGB ``[3, H, W]`` array (the decoding seam).

`FrameDecoder` is what the per-sample decode (`episodepipes.pipes.sample_decode`) calls for every camera
frame; `JpegFrames` is the one shards hold today, and video packets plug in beside it. A JPEG goes to libjpeg-turbo
directly (`episodepipes.pipes._decode.turbo`, simplejpeg: OpenCV's pixels, a quarter less CPU at 224x224) and
anything that path is not sure of to ``cv2.imdecode``. Where the target size is at most 1/2, 1/4 or 1/8 of the
source, libjpeg's reduced decode (`cv2.IMREAD_REDUCED_COLOR_*`, the same scale in simplejpeg) does most of the
resize for free.

A frame's bytes are checked against the index's size by their header (`episodepipes.imagehead`) before
``cv2.imdecode`` sees them: a 2 KB JPEG may declare 30000 x 30000, which OpenCV would allocate (2.7 GB) before
finding the data missing, and a CRC32 that matches says nothing about that.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import cv2
import numpy as np

from episodepipes.imagehead import header_size
from episodepipes.pipes._decode.turbo import decode_rgb

_REDUCED = ((8, cv2.IMREAD_REDUCED_COLOR_8), (4, cv2.IMREAD_REDUCED_COLOR_4), (2, cv2.IMREAD_REDUCED_COLOR_2))


class FrameDecoder(Protocol):
    """Decodes one camera frame; runs in decode workers, so it must pickle for ``method="process"``."""

    def field(self, camera: str) -> str:
        """The member field that holds ``camera``'s frame (``"front.jpg"``)."""
        ...

    def decode(self, camera: str, data: bytes, *, src: tuple[int, int], size: tuple[int, int] | None = None,
               out: np.ndarray | None = None) -> np.ndarray | None:
        """uint8 RGB ``[3, H, W]`` at ``size`` (or ``src``), into ``out`` when given; None when ``data`` is
        not a frame of the index's source size ``src`` (corrupt)."""
        ...


@dataclass(frozen=True)
class JpegFrames:
    """`FrameDecoder` of JPEG members (``<camera>.jpg``), through `decode_jpeg`."""

    def field(self, camera: str) -> str:
        return f"{camera}.jpg"

    def decode(self, camera: str, data: bytes, *, src: tuple[int, int], size: tuple[int, int] | None = None,
               out: np.ndarray | None = None) -> np.ndarray | None:
        return decode_jpeg(data, src=src, size=size, out=out)


JPEG = JpegFrames()


def reduced_flag(src: tuple[int, int], dst: tuple[int, int] | None) -> int:
    """The cheapest `cv2.imdecode` flag whose output is still at least ``dst`` in both dimensions."""
    return _reduced(src, dst)[0]


def _reduced(src: tuple[int, int], dst: tuple[int, int] | None) -> tuple[int, int]:
    """(`reduced_flag`, the factor libjpeg divides each dimension by, rounding up)."""
    if dst is not None:
        for f, flag in _REDUCED:
            if dst[0] * f <= src[0] and dst[1] * f <= src[1]:
                return flag, f
    return cv2.IMREAD_COLOR, 1


def decode_jpeg(data: bytes, *, src: tuple[int, int], size: tuple[int, int] | None = None,
                out: np.ndarray | None = None) -> np.ndarray | None:
    """uint8 RGB ``[3, H, W]`` at ``size`` (or the source size), written into ``out`` if given;
    None when the bytes are not a PNG or JPEG whose header declares ``src`` (checked before decoding), do not
    decode, or decode to another size than ``src`` (the index's): such a frame is not the one the index
    describes, so it is corrupt, never resized into place.

    Args:
        data: the JPEG file's bytes.
        src: ``(H, W)`` the index records for the frame; a decode of any other size is refused (None).
        size: ``(H, W)`` to return; None returns the source size. libjpeg's reduced decode does what it
            can of a downscale, `cv2.INTER_AREA` the rest.
        out: a uint8 ``[3, H, W]`` array to write into (a batch buffer's row); used only when its shape
            is the result's, else a new array is returned.
    """
    head = header_size(data)
    if head is None or (head != tuple(src) and head != (src[1], src[0])):  # (EXIF may turn it: decoded, checked)
        return None
    flag, f = _reduced(src, size)
    img = decode_rgb(data, head, f) if head == tuple(src) else None  # RGB, or None: OpenCV's BGR then
    rgb = img is not None
    if not rgb:
        img = cv2.imdecode(np.frombuffer(data, np.uint8), flag)
    if img is None or img.shape[0] != -(-src[0] // f) or img.shape[1] != -(-src[1] // f):
        return None
    if size is not None and img.shape[:2] != tuple(size):  # INTER_AREA works per channel: RGB or BGR alike
        img = cv2.resize(img, (size[1], size[0]), interpolation=cv2.INTER_AREA)
    if out is None or out.shape != (3, *img.shape[:2]):
        out = np.empty((3, *img.shape[:2]), np.uint8)
    # HWC -> RGB CHW in one SIMD pass, into out's planes
    cv2.split(img, [out[0], out[1], out[2]] if rgb else [out[2], out[1], out[0]])
    return out
