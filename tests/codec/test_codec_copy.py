from fractions import Fraction

import av
import numpy as np
import pyarrow.parquet as pq
import pytest

from benchmarks.lerobot_data import VIDEO_KEYS, make_lerobot
from episodepipes.codec import PacketDecoder, copy_packets
from episodepipes.codec.copy import copy_timed
from episodepipes.sharding.formats.synthetic import SyntheticReader

LENGTHS = (5, 7, 6)  # at GOP 4 in one shared mp4, episodes 1 and 2 start mid-GOP (frames 5 and 12)


def _direct(path):
    """(time, RGB [3, H, W]) of every frame, from PyAV decoding the file itself."""
    with av.open(str(path)) as c:
        s = c.streams.video[0]
        return [(float(f.pts * s.time_base), f.to_ndarray(format="rgb24").transpose(2, 0, 1)) for f in c.decode(s)]


def _decode(p):
    d = PacketDecoder(p.codec, p.extradata, size=(p.height, p.width))
    return [d.frame(p.keyframe_of(t), p.data[p.keyframe_of(t):p.lead + t + 1], p.lead + t - p.keyframe_of(t))
            for t in range(len(p))]


@pytest.mark.parametrize("encoder", ["libsvtav1", "libx264", "libvpx-vp9"])
def test_episodes_sharing_one_mp4_copy_frame_exact(tmp_path, encoder):
    make_lerobot(tmp_path, num_episodes=3, lengths=LENGTHS, episodes_per_file=3, gop=4, encoder=encoder,
                 image_feature=False)
    meta = pq.read_table(tmp_path / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    key = VIDEO_KEYS[0]
    path = tmp_path / f"videos/{key}/chunk-000/file-000.mp4"
    direct = _direct(path)
    leads = []
    for m, n in zip(meta, LENGTHS):
        start, end = m[f"videos/{key}/from_timestamp"], m[f"videos/{key}/to_timestamp"]
        p = copy_packets(path, start=start, end=end)
        want = [f for t, f in direct if start - 0.05 <= t < end - 0.05]
        assert len(p) == n == len(want)
        got = _decode(p)
        assert all(g is not None and np.array_equal(g, w) for g, w in zip(got, want))
        leads.append(p.lead)
    assert leads == [0, 1, 0]  # episode 1 starts at frame 5, one after keyframe 4; episode 2 at keyframe 12


def test_copy_keeps_the_codec_and_its_extradata(tmp_path):
    make_lerobot(tmp_path, num_episodes=1, length=4, encoder="libx264", image_feature=False)
    p = copy_packets(next(tmp_path.glob("videos/**/*.mp4")))
    assert (p.codec, p.height, p.width, len(p)) == ("h264", 64, 96, 4)
    assert p.extradata[:1] == b"\x01"  # the mp4's avcC record: packets are length-prefixed, not Annex B


def _write(path, encoder="libx264", options=None, n=12):
    frames = SyntheticReader(num_episodes=1, length=n, height=64, width=96, cameras=("c",)).read("ep0000")
    with av.open(str(path), "w") as out:
        s = out.add_stream(encoder, rate=10, options=options or {})
        s.width, s.height, s.pix_fmt, s.time_base = 96, 64, "yuv420p", Fraction(1, 10)
        for i, a in enumerate(frames.cameras["c"]):
            f = av.VideoFrame.from_ndarray(a, format="rgb24")
            f.pts = i
            out.mux(s.encode(f))
        out.mux(s.encode())
    return path


def test_a_gop_longer_than_the_bound_is_refused_with_the_fix(tmp_path):
    path = _write(tmp_path / "long.mp4", options={"g": "40", "bf": "0", "x264-params": "scenecut=0"}, n=40)
    with pytest.raises(ValueError, match=r"up to 31 frames apart.*max_gop=30.*--codec av1"):
        copy_packets(path, end=3.1)
    assert len(copy_packets(path, end=3.0)) == 30  # within the bound


def test_a_stream_that_reorders_frames_is_refused(tmp_path):
    path = _write(tmp_path / "b.mp4", options={"g": "12", "bf": "3", "preset": "medium"})
    with pytest.raises(ValueError, match="reorders frames.*--codec av1"):
        copy_packets(path)


def test_a_codec_copy_does_not_take_is_refused(tmp_path):
    path = _write(tmp_path / "m.mp4", encoder="mpeg4")
    with pytest.raises(ValueError, match="mpeg4.*--codec av1"):
        copy_packets(path)


def test_an_unknown_extension_or_an_empty_range_is_refused(tmp_path):
    path = _write(tmp_path / "ok.mp4", options={"g": "4", "bf": "0"})
    with pytest.raises(ValueError, match="unknown video extension"):
        copy_packets(path.rename(tmp_path / "ok.m3u8"))
    with pytest.raises(ValueError, match="no frame lies within"):
        copy_packets(_write(tmp_path / "ok.mp4", options={"g": "4", "bf": "0"}), start=5.0, end=6.0)


@pytest.mark.parametrize(("encoder", "options"), [
    ("libx265", {"x265-params": "bframes=0:keyint=4:min-keyint=4:scenecut=0:log-level=error"}),
    ("libx264", {"g": "4", "bf": "0", "x264-params": "scenecut=0"}),
])
def test_a_range_that_starts_mid_gop_decodes_exactly(tmp_path, encoder, options):
    path = _write(tmp_path / "v.mp4", encoder=encoder, options=options)
    p = copy_packets(path, start=0.5, end=1.0)  # frames 5..9; keyframes at 0, 4, 8
    assert (len(p), p.lead, p.key.tolist()) == (5, 1, [0, 0, 0, 0, 4, 4])
    want = [f for t, f in _direct(path) if 0.45 <= t < 0.95]
    assert all(np.array_equal(g, w) for g, w in zip(_decode(p), want, strict=True))


def test_copy_timed_gives_each_packets_shown_time_leading_packets_included(tmp_path):
    path = _write(tmp_path / "v.mp4", options={"g": "4", "bf": "0", "x264-params": "scenecut=0"})
    p, times = copy_timed(path, start=0.5, end=1.0)  # frames 5..9 and the keyframe 4 they need
    assert p.data == copy_packets(path, start=0.5, end=1.0).data
    np.testing.assert_allclose(times, [t for t, _ in _direct(path)][4:10])
