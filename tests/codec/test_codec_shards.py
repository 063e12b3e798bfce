"""`write --codec h264|av1`: shards of packets that video_pipe and metric_pipe read back within the PSNR bound."""

from __future__ import annotations

import json
import logging

import cv2
import numpy as np
import pytest
from helpers import write_raw

from episodepipes.index import EpisodeIndex, IndexFormatError
from episodepipes.pipes import metric_pipe, video_pipe
from episodepipes.sharding.cli import main
from episodepipes.sharding.formats.synthetic import SyntheticReader

READER = SyntheticReader(num_episodes=6, length=9, height=48, width=64)


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    return write_raw(tmp_path_factory.mktemp("codec") / "src", READER)


def _write(src, out, *args):
    assert main(["write", str(src), str(out), "--workers", "1", "--shard-size", "30kB", *args]) == 0
    return out


def _luma_psnr(a, b):
    ya, yb = (cv2.cvtColor(np.ascontiguousarray(x), cv2.COLOR_RGB2YUV)[..., 0].astype(np.float64) for x in (a, b))
    return 10 * np.log10(255 ** 2 / np.mean((ya - yb) ** 2))


def _frames(batches):
    return [(e, int(f), img.numpy().transpose(1, 2, 0), bool(v)) for b in batches
            for e, f, img, v in zip(b["episode"], b["frame"], b["front"], b["valid"])]


@pytest.mark.parametrize("codec", ["h264", "av1"])
def test_video_pipe_reads_packets_back_within_the_psnr_bound(src, tmp_path, codec):
    out = _write(src, tmp_path / "out", "--codec", codec, "--gop", "3")
    ep = EpisodeIndex.open(out).episode("ep0001")
    assert (ep.cameras["front"].codec, ep.cameras["front"].gop) == (codec, 3)
    assert len(EpisodeIndex.open(out).shards) > 1  # GOPs straddle shards: earlier packets come from the last one
    got = _frames(video_pipe(out, episodes=["ep0001"], batch_size=4, max_batches=100))
    source = READER.read("ep0001").cameras["front"]
    assert [f for _, f, _, _ in got] == list(range(9)) and all(v for *_, v in got)
    psnr = [_luma_psnr(img, np.asarray(s)) for (_, _, img, _), s in zip(got, source)]
    assert min(psnr) >= 35.0, psnr


def test_metric_pipe_sparse_frames_equal_the_sequential_decode(src, tmp_path):
    out = _write(src, tmp_path / "out", "--codec", "h264", "--gop", "4")
    seq = {(e, f): img for e, f, img, _ in _frames(video_pipe(out, episodes=["ep0002", "ep0005"], batch_size=5,
                                                                max_batches=100, num_workers=1))}
    sparse = _frames(metric_pipe(out, frames_per_episode=3, batch_size=2, num_workers=2))
    assert {f for _, f, _, _ in sparse} - {0, 4, 8}  # frames mid-GOP, whose keyframe was not planned
    for e, f, img, v in sparse:
        assert v and np.array_equal(img, seq[e, f]), (e, f)


def test_a_corrupt_packet_is_invalid_and_counted_with_the_rest_of_its_gop(src, tmp_path, caplog):
    out = _write(src, tmp_path / "out", "--codec", "av1", "--gop", "3", "--shard-size", "1MB")
    ep = EpisodeIndex.open(out).episode("ep0000")
    idx = EpisodeIndex.open(out)
    shard, a, b = ep.frame_range(3)  # a keyframe
    path = out / idx.shards[shard].name
    [(at, size)] = _packets(idx, path, "ep0000", 3, "front")
    data = bytearray(path.read_bytes())
    data[at + size // 2] ^= 0xFF  # inside the front camera's packet: the record's CRC32 no longer matches
    path.write_bytes(bytes(data))
    pipe = video_pipe(out, episodes=["ep0000"], batch_size=9, max_batches=100)
    with caplog.at_level(logging.WARNING):
        got = _frames(pipe)
    assert [v for *_, v in got] == [True] * 3 + [False] * 3 + [True] * 3
    assert pipe.stats["frames_corrupt"] == 6  # two cameras, three frames
    assert all(not img.any() for _, _, img, v in got if not v)


def test_jpeg_is_the_default_and_its_index_has_no_codec_fields(src, tmp_path):
    plain, named = _write(src, tmp_path / "a"), _write(src, tmp_path / "b", "--codec", "jpeg", "--gop", "7")
    files = sorted(p.name for p in plain.iterdir())
    assert files == sorted(p.name for p in named.iterdir())
    assert all((plain / f).read_bytes() == (named / f).read_bytes() for f in files if f != "_progress.json")
    assert "codec" not in json.loads((plain / "index.json").read_text())["options"]


def test_bad_codec_options_exit_2_naming_them(src, tmp_path, capsys):
    assert main(["write", str(src), str(tmp_path / "o"), "--codec", "h264", "--crf", "99"]) == 2
    assert "crf=99" in capsys.readouterr().err
    assert main(["write", str(src), str(tmp_path / "o"), "--codec", "av1", "--gop", "0"]) == 2
    assert "gop=0" in capsys.readouterr().err


@pytest.mark.parametrize(("field", "value", "needle"), [("codec", "mp4", "codec 'mp4'"), ("codec", 1, "codec=1"),
                                                        ("gop", 0, "gop=0"), ("gop", 5000, "gop=5000"),
                                                        ("gop", True, "gop=True")])
def test_hostile_codec_fields_are_refused_by_name(src, tmp_path, field, value, needle):
    out = _write(src, tmp_path / "out", "--codec", "h264")
    d = json.loads((out / "index.json").read_text())
    d["schemas"][0]["cameras"]["wrist"][field] = value
    (out / "index.json").write_text(json.dumps(d))
    with pytest.raises(IndexFormatError, match="schema 0 camera 'wrist'") as e:
        EpisodeIndex.open(out)
    assert needle in str(e.value)


def _without_crc(out):
    d = json.loads((out / "index.json").read_text())
    d["crc32"] = False
    del d["columns"]["crc32"]
    (out / "index.json").write_text(json.dumps(d))
    (out / "index.crc32.npy").unlink()
    return out


def _packets(idx, path, eid, frame, camera):
    """(offset, size) of each of a frame's packets of ``camera`` in its shard, from its packed record."""
    from episodepipes.codec.chunk import parse_record

    ep = idx.episode(eid)
    _, a, b = ep.frame_range(frame)
    record = path.read_bytes()[a:b]
    rec = parse_record(record, len(ep.cameras), len(ep.arrays))
    packets = [bytes(p) for p in rec.cameras[sorted(ep.cameras).index(camera)]]
    return [(a + record.index(p), len(p)) for p in packets]


def test_a_damaged_packet_without_checksums_is_caught_by_the_decoder(src, tmp_path):
    out = _without_crc(_write(src, tmp_path / "out", "--codec", "h264", "--gop", "3", "--shard-size", "1MB"))
    idx = EpisodeIndex.open(out)
    assert not idx.has_crc
    shard, a, b = idx.episode("ep0000").frame_range(3)
    path = out / idx.shards[shard].name
    [(at, size)] = _packets(idx, path, "ep0000", 3, "front")
    data = bytearray(path.read_bytes())
    data[at:at + size] = np.random.default_rng(0).integers(0, 256, size, np.uint8).tobytes()
    path.write_bytes(bytes(data))
    pipe = video_pipe(out, episodes=["ep0000"], batch_size=9, max_batches=1)
    got = _frames(pipe)
    assert [v for *_, v in got] == [True] * 3 + [False] * 3 + [True] * 3
    assert pipe.stats["frames_corrupt"] == 3  # the front camera's frames 3-5; the wrist camera is intact


def test_process_workers_decode_the_same_frames(src, tmp_path):
    out = _write(src, tmp_path / "out", "--codec", "av1", "--gop", "2")
    threads = _frames(video_pipe(out, episodes=["ep0000", "ep0001"], batch_size=4, max_batches=100))
    procs = _frames(video_pipe(out, episodes=["ep0000", "ep0001"], batch_size=4, max_batches=100, method="process"))
    assert len(threads) == 18 and all(v for *_, v in procs)
    assert all(np.array_equal(a[2], b[2]) for a, b in zip(threads, procs))


def test_a_whole_episode_reads_each_frame_once_and_sparse_frames_read_their_gop(src, tmp_path):
    out = _write(src, tmp_path / "out", "--codec", "h264", "--gop", "4", "--shard-size", "1MB")
    idx = EpisodeIndex.open(out)
    size = {e: [idx.episode(e).frame_range(f)[2] - idx.episode(e).frame_range(f)[1] for f in range(9)]
            for e in ("ep0002", "ep0005")}
    pipe = video_pipe(out, episodes=["ep0002"], batch_size=9, max_batches=1)
    _frames(pipe)
    assert pipe.stats["bytes_read"] == sum(size["ep0002"])  # no frame read twice for its successors' GOPs
    sparse = metric_pipe(out, frames_per_episode=3, batch_size=3, split="val")
    got = {(e, f) for e, f, _, _ in _frames(sparse)}
    own = sum(size[e][f] for e, f in got)
    gops = sum(sum(size[e][f - f % 4:f + 1]) for e, f in got)
    assert own < sparse.stats["bytes_read"] <= gops  # each frame's GOP up to it, and nothing more


def test_resize_applies_to_video_frames(src, tmp_path):
    out = _write(src, tmp_path / "out", "--codec", "h264", "--gop", "3")
    full = _frames(video_pipe(out, episodes=["ep0003"], batch_size=9, max_batches=1))
    small = _frames(video_pipe(out, episodes=["ep0003"], batch_size=9, max_batches=1, resize=(24, 32)))
    assert all(img.shape == (24, 32, 3) and v for _, _, img, v in small)
    for (_, _, a, _), (_, _, b, _) in zip(full, small):
        assert np.array_equal(b, cv2.resize(a, (32, 24), interpolation=cv2.INTER_AREA))
