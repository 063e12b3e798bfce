"""`Packets`: one camera's compressed frames, as the encoder, the packet copier and the decoder share them.

Packets are in decode order, which is also presentation order: the encoder uses no B-frames and the copier
refuses streams that reorder, so frame ``t`` is packet ``lead + t`` and decoding it needs exactly the packets
from ``key[lead + t]`` to ``lead + t``. ``lead`` counts packets kept only because a later frame depends on them
(an episode that starts mid-GOP inside a shared mp4); they are decoded but never returned.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# codec name (as FFmpeg names the bitstream) -> the PyAV decoder used for it; FFmpeg's own "av1" decoder
# needs a hardware device, libdav1d is the software one
DECODERS = {"h264": "h264", "hevc": "hevc", "av1": "libdav1d", "vp9": "vp9"}
# Container extension -> FFmpeg demuxer, for the video files a source dataset holds (raw folders, copies).
# The one table: sharding.formats.video re-exports it; LeRobot accepts its own subset (`formats.lerobot`).
DEMUXERS = {".mp4": "mov", ".m4v": "mov", ".mov": "mov", ".mkv": "matroska", ".webm": "matroska", ".avi": "avi"}
MAX_SIDE = 8192  # 8K; a larger side read from a file is a damaged or hostile header, not a camera


@dataclass(frozen=True)
class Packets:
    """The packets of one camera over a frame range, and what a decoder needs to read them."""

    codec: str
    extradata: bytes
    height: int
    width: int
    data: list[bytes]
    key: np.ndarray  # int64 per packet: the index of the keyframe packet it depends on (itself for a keyframe)
    lead: int = 0

    def __post_init__(self) -> None:
        if self.codec not in DECODERS:
            raise ValueError(f"codec={self.codec!r} should be one of {sorted(DECODERS)}")
        if not (0 < self.height <= MAX_SIDE and 0 < self.width <= MAX_SIDE):
            raise ValueError(f"{self.height}x{self.width} should be within 1..{MAX_SIDE} on each side")
        n = len(self.data)
        key = np.asarray(self.key)
        if key.shape != (n,) or not 0 <= self.lead <= n:
            raise ValueError(f"{key.shape=} should be ({n},) and lead={self.lead} within 0..{n}")
        idx = np.arange(n)
        if n and (key[0] != 0 or np.any(key > idx) or np.any(key[key] != key) or np.any(np.diff(key) < 0)):
            raise ValueError("key should point each packet at a keyframe at or before it, in order, from packet 0")

    def __len__(self) -> int:
        """Frames (leading packets excluded)."""
        return len(self.data) - self.lead

    def keyframe_of(self, t: int) -> int:
        """The packet index decoding frame ``t`` starts from."""
        return int(self.key[self.lead + t])

    def max_gop(self) -> int:
        """The most packets any kept frame needs decoded, its own included."""
        idx = np.arange(self.lead, len(self.data))
        return int((idx - self.key[idx]).max()) + 1 if len(idx) else 0
