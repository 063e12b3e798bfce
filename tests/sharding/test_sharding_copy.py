"""``--codec copy`` on the reader side: LeRobot and raw mp4 cameras come as packets copied from the source,
never decoded, and every source copy cannot take is refused with the fix."""

import json
import pickle
from fractions import Fraction

import av
import numpy as np
import pyarrow.parquet as pq
import pytest
from helpers import write_raw, write_zarr

from benchmarks.lerobot_data import VIDEO_KEYS, make_lerobot
from episodepipes.codec import PacketDecoder, Packets
from episodepipes.sharding.cli import main
from episodepipes.sharding.episode import EpisodeData, EpisodeError
from episodepipes.sharding.formats.lerobot import LeRobotReader
from episodepipes.sharding.formats.raw import RawReader
from episodepipes.sharding.formats.synthetic import SyntheticReader
from episodepipes.sharding.write import WriteOptions, write_shards

LENGTHS = (9, 7, 11)  # at GOP 4 in one shared mp4, episodes 1 and 2 start mid-GOP (frames 9 and 16)


def _source(path):
    """Every packet of ``path`` (pts, bytes) and every frame (pts, RGB), straight from PyAV."""
    with av.open(str(path)) as c:
        s = c.streams.video[0]
        packets = [(p.pts, bytes(p)) for p in c.demux(s) if p.size]
    with av.open(str(path)) as c:
        s = c.streams.video[0]
        frames = [(f.pts, f.to_ndarray(format="rgb24")) for f in c.decode(s)]
    return packets, frames


def _decode(p: Packets) -> list[np.ndarray]:
    """Every frame of ``p`` through the shards' own decoder, as HxWx3 RGB."""
    d = PacketDecoder(p.codec, p.extradata, size=(p.height, p.width))
    out = []
    for t in range(len(p)):
        k = p.keyframe_of(t)
        out.append(d.frame(k, p.data[k:p.lead + t + 1], p.lead + t - k).transpose(1, 2, 0))
    return out


@pytest.mark.parametrize(("version", "encoder"), [("v3.0", "libsvtav1"), ("v3.0", "libx264"), ("v2.1", "libsvtav1")])
def test_lerobot_copy_gives_the_source_packets_and_decodes_frame_exact(tmp_path, version, encoder):
    make_lerobot(tmp_path, lengths=LENGTHS, num_episodes=3, episodes_per_file=3, gop=4, encoder=encoder,
                 version=version, image_feature=False)
    reader = pickle.loads(pickle.dumps(LeRobotReader(tmp_path, copy=True)))  # as encoder processes get it
    assert reader.copy
    first = 0
    for eid, n in zip(reader.episode_ids(), LENGTHS, strict=True):
        ep = reader.read(eid)
        assert ep.cameras == {} and sorted(ep.packets) == sorted(k.replace(".", "_") for k in VIDEO_KEYS)
        for key in VIDEO_KEYS:
            p = ep.packets[key.replace(".", "_")]
            path = tmp_path / ep.files[key.replace(".", "_")].split(f"{tmp_path}/", 1)[1]
            packets, frames = _source(path)
            lo = first if version == "v3.0" else 0  # the episode's first frame in its file
            assert len(p) == n and p.lead == lo % 4  # the lead goes back to the keyframe before it
            # copied, not decoded: the very bytes of the file's packets, from that keyframe on
            assert p.data == [b for _, b in packets[lo - p.lead:lo + n]]
            assert p.codec == ("av1" if encoder == "libsvtav1" else "h264") and p.max_gop() <= 4
            for t, got in enumerate(_decode(p)):
                np.testing.assert_array_equal(got, frames[lo + t][1], err_msg=f"{eid} {key} frame {t}")
        first += n


def _write_mp4(path, frames, *, encoder="libx264", options=None, fps=10):
    with av.open(str(path), "w") as out:
        s = out.add_stream(encoder, rate=fps, options=options or {"g": "3", "bf": "0"})
        s.width, s.height, s.pix_fmt, s.time_base = frames[0].shape[1], frames[0].shape[0], "yuv420p", Fraction(1, fps)
        for i, a in enumerate(frames):
            f = av.VideoFrame.from_ndarray(a, format="rgb24")
            f.pts = i
            out.mux(s.encode(f))
        out.mux(s.encode())


def _raw(src, *, encoders=("libx264", "libsvtav1"), options=None, png=False, episodes=2, length=8):
    """Raw episode folders whose cameras are h264/AV1 mp4s (PyAV-encoded), or one PNG folder with ``png``."""
    synth = SyntheticReader(num_episodes=episodes, length=length, height=48, width=64, cameras=("front", "wrist"))
    write_raw(src, synth, video_cams=() if png else ("front", "wrist"))
    if png:
        return src
    for eid in synth.episode_ids():
        ep = synth.read(eid)
        for (cam, frames), enc in zip(sorted(ep.cameras.items()), encoders):
            (src / eid / f"{cam}.mp4").unlink()
            _write_mp4(src / eid / f"{cam}.mp4", list(frames), encoder=enc,
                       options=options or ({"g": "3", "bf": "0"} if enc == "libx264" else {"g": "3"}))
    return src


def test_raw_mp4_copy_gives_the_files_packets_and_decodes_frame_exact(tmp_path):
    src = _raw(tmp_path / "src")
    reader = RawReader(src, copy=True)
    for eid in reader.episode_ids():
        ep = reader.read(eid)
        assert ep.cameras == {} and sorted(ep.packets) == ["front", "wrist"]
        for cam, codec in (("front", "h264"), ("wrist", "av1")):
            p, (packets, frames) = ep.packets[cam], _source(src / eid / f"{cam}.mp4")
            assert (p.codec, p.lead, len(p)) == (codec, 0, 8)
            assert p.data == [b for _, b in packets]  # copied byte for byte, nothing re-encoded
            for t, got in enumerate(_decode(p)):
                np.testing.assert_array_equal(got, frames[t][1], err_msg=f"{eid} {cam} frame {t}")


def test_without_copy_the_readers_still_decode(tmp_path):
    make_lerobot(tmp_path / "lr", lengths=LENGTHS, num_episodes=3, episodes_per_file=3, image_feature=False)
    ep = LeRobotReader(tmp_path / "lr").read("episode_000001")
    assert ep.packets == {} and len(list(ep.cameras["observation_images_front"])) == LENGTHS[1]
    ep = RawReader(_raw(tmp_path / "raw")).read("ep0000")
    assert ep.packets == {} and len(list(ep.cameras["front"])) == 8


# --- what copy cannot take is refused, by name, with the fix --------------------------------------------

def test_a_gop_over_the_bound_is_refused_naming_the_camera_and_the_fix(tmp_path, capsys):
    make_lerobot(tmp_path / "lr", lengths=(70,), num_episodes=1, gop=60, encoder="libx264", image_feature=False)
    with pytest.raises(EpisodeError, match=r"episode 'episode_000000' camera 'observation.images.front' .*"
                                           r"up to 60 frames apart, more than max_gop=30.*--codec av1"):
        LeRobotReader(tmp_path / "lr", copy=True).read("episode_000000")
    assert main(["write", str(tmp_path / "lr"), str(tmp_path / "out"), "--codec", "copy", "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "up to 60 frames apart" in err and "file-000.mp4" in err and "--codec av1" in err
    assert not (tmp_path / "out" / "index.json").exists()


def test_a_stream_with_b_frames_is_refused(tmp_path, capsys):
    src = _raw(tmp_path / "src", encoders=("libx264", "libx264"), options={"g": "12", "bf": "3", "preset": "medium"},
               length=12)
    assert main(["write", str(src), str(tmp_path / "out"), "--codec", "copy", "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "camera 'front'" in err and "reorders frames" in err and "--codec av1" in err


def test_cameras_without_video_stay_frames_and_a_zarr_source_is_refused(tmp_path, capsys):
    make_lerobot(tmp_path / "lr", num_episodes=1, length=4)  # with an image feature (PNG cells in the parquet)
    ep = LeRobotReader(tmp_path / "lr", copy=True).read("episode_000000")
    assert sorted(ep.packets) == ["observation_images_front", "observation_images_wrist"]
    assert list(ep.cameras) == ["observation_images_gripper"]
    assert len(list(ep.cameras["observation_images_gripper"])) == 4
    src = _raw(tmp_path / "png", png=True)
    ep = RawReader(src, copy=True).read("ep0000")
    assert ep.packets == {} and sorted(ep.cameras) == ["front", "wrist"]
    zarr_src = write_zarr(tmp_path / "zarr", SyntheticReader(num_episodes=1, length=4, height=32, width=32))
    assert main(["write", str(zarr_src), str(tmp_path / "out"), "--codec", "copy", "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "zarr, whose frames are not stored as video" in err
    assert "--codec av1 or --codec h264" in err


@pytest.mark.parametrize("flag", [["--gop", "4"], ["--crf", "20"], ["--resize", "32x32"]])
def test_encoder_options_with_copy_are_refused(tmp_path, capsys, flag):
    src = _raw(tmp_path / "src", episodes=1)
    assert main(["write", str(src), str(tmp_path / "out"), "--codec", "copy", *flag]) == 2
    err = capsys.readouterr().err
    assert f"{flag[0]} {flag[1]} does not apply to --codec copy" in err and "--codec av1" in err
    assert not (tmp_path / "out").exists()


def test_rows_that_skip_a_frame_cannot_be_copied(tmp_path):
    # drop row 3 of a one-episode v2.1 dataset: the rows take frames 0-2 and 4-7, which decoding does
    # (LeRobot's rule), but copied packets would shift every later frame by one
    make_lerobot(tmp_path, num_episodes=1, length=8, version="v2.1", image_feature=False)
    path = next(tmp_path.glob("data/**/*.parquet"))
    t = pq.read_table(path)
    t = t.filter(np.arange(8) != 3)
    t = t.set_column(t.schema.get_field_index("frame_index"), "frame_index", [np.arange(7)])
    pq.write_table(t, path)
    jsonl = tmp_path / "meta/episodes.jsonl"
    jsonl.write_text(json.dumps(dict(json.loads(jsonl.read_text()), length=7)) + "\n")
    assert len(list(LeRobotReader(tmp_path).read("episode_000000").cameras["observation_images_front"])) == 7
    with pytest.raises(EpisodeError, match=r"row 3 takes the frame at 0.400000s.*re-encode it with --codec av1"):
        LeRobotReader(tmp_path, copy=True).read("episode_000000")


def test_write_shards_refuses_a_reader_and_codec_that_disagree(tmp_path):
    src = _raw(tmp_path / "src", episodes=1)
    with pytest.raises(ValueError, match=r"codec='copy' needs a reader that copies.*copy=True"):
        write_shards(RawReader(src), tmp_path / "a", WriteOptions(format="raw", codec="copy"))
    with pytest.raises(ValueError, match=r"copies video packets, which codec='jpeg' cannot take"):
        write_shards(RawReader(src, copy=True), tmp_path / "b", WriteOptions(format="raw"))
    with pytest.raises(ValueError, match=r"resize=\(32, 32\) cannot apply to codec='copy'"):
        write_shards(RawReader(src, copy=True), tmp_path / "c", WriteOptions(format="raw", codec="copy",
                                                                            resize=(32, 32)))
    assert WriteOptions(format="raw", codec="copy").to_dict()["codec"] == "copy"
    assert "gop" not in WriteOptions(format="raw", codec="copy").to_dict()
    with pytest.raises(ValueError, match="copy=1 should be True or False"):
        RawReader(src, copy=1)


# --- EpisodeData checks copied packets as it checks frames ----------------------------------------------

def _packets(n, lead=0):
    return Packets("h264", b"", 8, 8, [b"x"] * (n + lead), np.zeros(n + lead, np.int64), lead)


def test_episode_data_checks_its_packets():
    ok = EpisodeData(id="e", cameras={}, arrays={"a": np.zeros(3)}, fps=10,
                     packets={"front": _packets(3, lead=2), "wrist": _packets(3)})
    assert len(ok.packets["front"]) == 3
    with pytest.raises(EpisodeError, match=r"episode 'e': packets of camera 'front' are a list"):
        EpisodeData(id="e", cameras={}, arrays={}, fps=10, packets={"front": [b"x"]})
    with pytest.raises(EpisodeError, match=r"copied cameras have \{'front': 3, 'wrist': 2\} frames"):
        EpisodeData(id="e", cameras={}, arrays={}, fps=10, packets={"front": _packets(3), "wrist": _packets(2)})
    with pytest.raises(EpisodeError, match=r"\{.front.: 0\} frames .*at least 1"):
        EpisodeData(id="e", cameras={}, arrays={}, fps=10, packets={"front": _packets(0, lead=1)})
    with pytest.raises(EpisodeError, match=r"arrays \{'a': 4\} have other step counts than the 3 frames"):
        EpisodeData(id="e", cameras={}, arrays={"a": np.zeros(4)}, fps=10, packets={"front": _packets(3)})
    with pytest.raises(EpisodeError, match=r"cameras \['front'\] have both frames and copied packets"):
        EpisodeData(id="e", cameras={"front": []}, arrays={}, fps=10, packets={"front": _packets(3)})
    with pytest.raises(EpisodeError, match=r"would share the shard field"):
        EpisodeData(id="e", cameras={"a.b": []}, arrays={}, fps=10, packets={"a_b": _packets(3)})
    with pytest.raises(EpisodeError, match=r"reserved"):
        EpisodeData(id="e", cameras={}, arrays={}, fps=10, packets={"json": _packets(3)})


def _packet_count(path):
    with av.open(str(path)) as c:
        return sum(1 for p in c.demux(c.streams.video[0]) if p.size)


def test_lerobot_copy_opens_and_demuxes_each_shared_mp4_once_and_reads_each_parquet_once(tmp_path):
    lengths = (9, 7, 11, 8, 6, 10)  # at GOP 4, three episodes per file: most start mid-GOP
    make_lerobot(tmp_path, lengths=lengths, num_episodes=6, episodes_per_file=3, gop=4, image_feature=False)
    files = sorted(tmp_path.glob("videos/**/*.mp4"))
    reader = LeRobotReader(tmp_path, copy=True)
    ids = reader.episode_ids()
    eps = {eid: reader.read(eid).packets for eid in ids}
    assert [len(p) for p in eps[ids[1]].values()] == [7, 7] and len(files) == 4  # 2 files x 2 cameras
    # every file opened once and each of its packets demuxed once, over the episodes it holds; closed after the last
    assert reader.video_counts == {"opened": 4, "demuxed": sum(map(_packet_count, files))}
    assert reader._videos == {} and reader._data is None
    assert reader.data_reads == len(list(tmp_path.glob("data/**/*.parquet"))) == 2  # a parquet read per file too
    # out of order (backwards, and an episode again): each read seeks, and copies the very same packets
    again = LeRobotReader(tmp_path, copy=True)
    for eid in [*reversed(ids), ids[1], ids[1], ids[4]]:
        for cam, p in again.read(eid).packets.items():
            want = eps[eid][cam]
            assert (p.data, p.key.tolist(), p.lead) == (want.data, want.key.tolist(), want.lead), (eid, cam)
    again.close()
    assert again._videos == {}
