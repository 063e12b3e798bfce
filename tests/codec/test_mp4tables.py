"""`codec.mp4tables`: an mp4's packets read from its sample tables equal FFmpeg's demux of it, packet for packet;
files the tables do not describe plainly go to the demuxer; damaged boxes are refused, saying where."""

from __future__ import annotations

import struct

import av
import numpy as np
import pytest
from helpers import write_mp4

from episodepipes.codec.mp4tables import Mp4Error, read_tables


def _frames(n=12, h=48, w=64):
    rng = np.random.default_rng(0)
    return [np.clip(rng.integers(0, 255, (h, w, 3)) // 8 * 8 + i, 0, 255).astype(np.uint8) for i in range(n)]


def _demuxed(path):
    with av.open(str(path)) as c:
        s = c.streams.video[0]
        tb, cc = float(s.time_base), s.codec_context
        pk = [(p.pts * tb, p.pos, p.size, p.is_keyframe) for p in c.demux(s) if p.size]
        return pk, (cc.codec.canonical_name, bytes(cc.extradata or b""), cc.height, cc.width, float(s.average_rate))


@pytest.mark.parametrize(("encoder", "options"), [("libsvtav1", {"g": "4"}),
                                                  ("libx264", {"g": "3", "bf": "0", "sc_threshold": "0"})])
def test_the_tables_are_the_demuxers_packets(tmp_path, encoder, options):
    path = tmp_path / "cam.mp4"
    write_mp4(path, _frames(), encoder, options)
    t = read_tables(memoryview(path.read_bytes()))
    pk, setup = _demuxed(path)
    assert t is not None
    assert t.times.tolist() == [p[0] for p in pk]
    assert t.pos.tolist() == [p[1] for p in pk] and t.size.tolist() == [p[2] for p in pk]
    assert t.keys.tolist() == [p[3] for p in pk] and 0 < t.keys.sum() < len(pk)
    assert (t.codec, t.extradata, t.height, t.width, t.rate) == setup


def test_b_frames_and_fragments_go_to_the_demuxer(tmp_path):
    path = tmp_path / "b.mp4"
    write_mp4(path, _frames(), "libx264", {"g": "6", "bf": "2"})  # composition offsets (ctts)
    assert read_tables(memoryview(path.read_bytes())) is None
    frag = tmp_path / "frag.mp4"
    with av.open(str(path)) as i, av.open(str(frag), "w", format="mp4",
                                          options={"movflags": "frag_keyframe+empty_moov"}) as o:
        s = o.add_stream_from_template(i.streams.video[0])
        for p in i.demux(i.streams.video[0]):
            if p.size:
                p.stream = s
                o.mux(p)
    assert read_tables(memoryview(frag.read_bytes())) is None


def _box(data: bytes, kind: bytes) -> int:
    at = data.find(kind)
    assert at > 4
    return at - 4


def test_damaged_boxes_are_refused_saying_where(tmp_path):
    path = tmp_path / "cam.mp4"
    write_mp4(path, _frames(), "libsvtav1", {"g": "4"})
    good = path.read_bytes()
    at = _box(good, b"stsz")
    huge = bytearray(good)
    huge[at + 16:at + 20] = struct.pack(">I", 1 << 30)  # a sample count far past the box's entries
    with pytest.raises(Mp4Error, match="stsz"):
        read_tables(memoryview(bytes(huge)))
    common = bytearray(good)
    at = _box(good, b"stsz")
    common[at + 12:at + 20] = struct.pack(">II", 1 << 20, (1 << 32) - 1)  # one size for 2^32 samples: no table
    with pytest.raises(Mp4Error, match="stsz.*more than the file"):  # refused before any array of that count
        read_tables(memoryview(bytes(common)))
    past = bytearray(good)
    at = _box(good, b"moov")
    past[at:at + 4] = struct.pack(">I", len(good))  # a box that claims more than the file holds
    with pytest.raises(Mp4Error, match="moov"):
        read_tables(memoryview(bytes(past)))
    out = bytearray(good)
    at = _box(good, b"stco")
    out[at + 16:at + 20] = struct.pack(">I", len(good) - 2)  # the first chunk starts near the file's end
    with pytest.raises(Mp4Error, match="past the file's end"):
        read_tables(memoryview(bytes(out)))
