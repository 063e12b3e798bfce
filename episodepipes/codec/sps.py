"""The frame size an h264 stream's sequence parameter sets (SPS) declare, read before a decoder sees them.

A keyframe of a few hundred bytes may carry an SPS declaring 16000 x 16000 (its CRC32 matches: it was written so).
FFmpeg's h264 decoder sizes its per-macroblock tables and frames by it and conceals the missing picture at that
size (seconds, 400 MB a frame) before the frame comes out and its size can be checked; the ``max_pixels`` limit
`PacketDecoder` sets stops the frames but not the tables (70 MB and 0.1-0.4 s per keyframe). So `declared_pixels`
reads the SPS of a packet (or of the stream's extradata) first: the few NAL units up to the first slice, found by
their start codes (Annex B, the writer's packets) or their lengths (AVCC, packets copied from an mp4), and the
Exp-Golomb fields up to the picture size. Microseconds, nothing allocated.
"""

from __future__ import annotations

from collections.abc import Iterator

_SPS, _SLICES = 7, frozenset(range(1, 6))  # NAL unit types: sequence parameter set; coded slices
_HIGH = frozenset([100, 110, 122, 244, 44, 83, 86, 118, 128, 138, 139, 134, 135])  # profiles with chroma fields


def avcc_length(extradata: bytes) -> int:
    """The NAL length field's size of an AVCC stream (``extradata`` is an avcC record), 0 for Annex B."""
    return (extradata[4] & 3) + 1 if len(extradata) >= 7 and extradata[0] == 1 else 0


def declared_pixels(data: bytes, length: int = 0, *, extradata: bool = False) -> int:
    """The most pixels (macroblock-aligned) an SPS in ``data`` declares, 0 if it holds none that parses.

    ``data`` is a packet (Annex B when ``length`` is 0, else NAL units after ``length``-byte sizes) or, with
    ``extradata``, an avcC record or Annex B parameter sets. Only NAL units before the first slice are read: an
    access unit's parameter sets come first.
    """
    units = _avcc_record(data) if extradata and avcc_length(data) else (
        _sized(data, length) if length else _annexb(data))
    most = 0
    for nal in units:
        kind = nal[0] & 0x1F if len(nal) else 0
        if kind in _SLICES:
            break
        if kind == _SPS:
            most = max(most, _sps_pixels(bytes(nal[1:512])))  # its size fields come first: no more is read
    return most


def _annexb(data: bytes) -> Iterator[memoryview]:
    """NAL units up to the first slice, whose end is never searched for (it runs to the end of the packet)."""
    view, i = memoryview(data), data.find(b"\x00\x00\x01")
    while 0 <= i < len(data) - 3:
        if data[i + 3] & 0x1F in _SLICES:
            return
        j = data.find(b"\x00\x00\x01", i + 3)
        yield view[i + 3:j if j >= 0 else len(data)]
        i = j


def _sized(data: bytes, length: int) -> Iterator[memoryview]:
    view, i = memoryview(data), 0
    while i + length <= len(view):
        n = int.from_bytes(view[i:i + length], "big")
        yield view[i + length:i + length + n]
        i += length + n


def _avcc_record(data: bytes) -> Iterator[memoryview]:
    view = memoryview(data)
    i = 6  # version, profile, compatibility, level, length size, SPS count (low 5 bits)
    for _ in range(view[5] & 0x1F):
        if i + 2 > len(view):
            return
        n = int.from_bytes(view[i:i + 2], "big")
        yield view[i + 2:i + 2 + n]
        i += 2 + n


class _Bits:
    """Exp-Golomb reader over an RBSP (emulation prevention bytes removed) held as one integer."""

    def __init__(self, rbsp: bytes) -> None:
        self.value, self.left = int.from_bytes(rbsp, "big"), 8 * len(rbsp)

    def u(self, n: int) -> int:
        if n > self.left:
            raise ValueError("SPS cut short")
        self.left -= n
        return (self.value >> self.left) & ((1 << n) - 1)

    def ue(self) -> int:
        rest = self.value & ((1 << self.left) - 1)
        zeros = self.left - rest.bit_length()
        if zeros > 31:
            raise ValueError("Exp-Golomb code past 32 bits")
        self.u(zeros)
        return self.u(zeros + 1) - 1

    def se(self) -> int:
        k = self.ue()
        return (k + 1) // 2 if k % 2 else -(k // 2)


def _sps_pixels(payload: bytes) -> int:
    """Coded pixels of an SPS (the bytes after its NAL header), 0 if it does not parse this far."""
    r = _Bits(payload.replace(b"\x00\x00\x03", b"\x00\x00"))
    try:
        profile = r.u(8)
        r.u(16)  # constraint flags, level
        r.ue()  # seq_parameter_set_id
        if profile in _HIGH:
            if r.ue() == 3:  # chroma_format_idc 4:4:4
                r.u(1)
            r.ue(), r.ue(), r.u(1)  # bit depths, qpprime_y_zero_transform_bypass
            if r.u(1):  # scaling matrices: skipped list by list
                for i in range(8 if profile != 244 else 12):
                    if r.u(1):
                        _skip_scaling_list(r, 16 if i < 6 else 64)
        r.ue()  # log2_max_frame_num_minus4
        poc = r.ue()
        if poc == 0:
            r.ue()
        elif poc == 1:
            r.u(1), r.se(), r.se()
            for _ in range(min(r.ue(), 255)):
                r.se()
        r.ue(), r.u(1)  # max_num_ref_frames, gaps_in_frame_num_allowed
        mbs_w, units_h = r.ue() + 1, r.ue() + 1
        frames_only = r.u(1)
    except ValueError:
        return 0
    return 256 * mbs_w * units_h * (2 - frames_only)


def _skip_scaling_list(r: _Bits, size: int) -> None:
    last = nxt = 8
    for _ in range(size):
        if nxt:
            nxt = (last + r.se()) % 256
        last = nxt or last
