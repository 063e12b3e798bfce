"""One camera's frames, decoded in episode order from what each frame's bytes hold, for the page's videos.

A JPEG frame's header is checked against the index's size before OpenCV decodes it (`episodepipes.imagehead`: a
few bytes may declare a frame of gigabytes). Video packets (h264/AV1) go through the project's `PacketDecoder`,
bounded to the index's frame size; the page reads an episode forward from frame 0, so a GOP's packets are
gathered as its frames come and each packet is decoded once. A frame that does not decode is None: the video
shows it grey and the page lists it.
"""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np

from episodepipes.codec import PacketDecoder
from episodepipes.imagehead import header_size
from episodepipes.index import Camera


def decode_jpeg(data: bytes | memoryview, size: tuple[int, int]) -> np.ndarray | None:
    """``H x W x 3`` uint8 RGB of a JPEG that declares and holds ``size`` (height, width), else None."""
    if header_size(data) != size:
        return None
    img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    if img is None or img.shape[:2] != size:
        return None
    return cv2.cvtColor(img, cv2.COLOR_BGR2RGB)


class CameraFrames:
    """Frames of one camera, asked for in order ``0, 1, 2, ...`` (`frame`)."""

    def __init__(self, camera: Camera) -> None:
        self.camera = camera
        self.size = (camera.height, camera.width)
        video = camera.codec != "jpeg"
        self._decoder = PacketDecoder(camera.codec, camera.extradata, size=self.size) if video else None
        self._key: int | None = None  # the frame the current GOP's decode starts at
        self._packets: list[bytes] = []  # that GOP's packets so far

    def frame(self, t: int, blobs: Sequence[bytes | memoryview], back: int) -> np.ndarray | None:
        """Frame ``t`` as ``H x W x 3`` uint8 RGB, or None when it does not decode.

        Args:
            t: the frame, one more than the last one asked for (from 0).
            blobs: what frame ``t`` holds of this camera: one JPEG, or its packets (a copied stream's first frame
                may carry packets before its own, decoded but not shown).
            back: how many frames before ``t`` the camera's decode starts (0 at a key frame).
        """
        if self._decoder is None:
            return decode_jpeg(blobs[0], self.size) if len(blobs) == 1 else None
        key = t - back
        if back == 0:
            self._key, self._packets = key, []
        elif self._key != key:  # a GOP whose key frame was not read (or damaged): nothing to decode it from
            return None
        self._packets += [bytes(b) for b in blobs]
        planes = self._decoder.frame(key, self._packets, len(self._packets) - 1, tail=0)
        return None if planes is None else cv2.merge([planes[0], planes[1], planes[2]])

    def lose(self) -> None:
        """The frame asked for next was not read (its bytes are damaged): the GOP it is part of cannot go on."""
        self._key = None
