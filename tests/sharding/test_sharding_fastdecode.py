"""`write --codec h264 --fast-decode`: x264's fastdecode tune carried from the CLI and `WriteOptions` to the encoder."""

from __future__ import annotations

import json

import cv2
import numpy as np
import pytest
from helpers import write_raw

from episodepipes.codec import CodecOptions, encode_frames
from episodepipes.codec.chunk import parse_record
from episodepipes.index import EpisodeIndex
from episodepipes.pipes import video_pipe
from episodepipes.sharding.cli import main
from episodepipes.sharding.formats.readers import FORMATS
from episodepipes.sharding.formats.synthetic import SyntheticReader
from episodepipes.sharding.write import WriteOptions, write_shards

READER = SyntheticReader(num_episodes=3, length=8, height=48, width=64)


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    return write_raw(tmp_path_factory.mktemp("fastdecode") / "src", READER)


def _write(src, out, *args):
    assert main(["write", str(src), str(out), "--workers", "1", "--codec", "h264", "--gop", "2", "--crf", "20",
                 *args]) == 0
    return out


def _front_packets(out, eid):
    """Every frame's ``front`` packet of ``eid``, read from its shard's packed records."""
    idx = EpisodeIndex.open(out)
    ep = idx.episode(eid)
    got = []
    for f in range(ep.length):
        shard, a, b = ep.frame_range(f)
        record = (out / idx.shards[shard].name).read_bytes()[a:b]
        rec = parse_record(record, len(ep.cameras), len(ep.arrays))
        got.append(b"".join(bytes(p) for p in rec.cameras[sorted(ep.cameras).index("front")]))
    return got


def test_fast_decode_shards_hold_the_fastdecode_encoders_packets(src, tmp_path):
    fast, plain = _write(src, tmp_path / "fast", "--fast-decode"), _write(src, tmp_path / "plain")
    frames = list(READER.read("ep0001").cameras["front"])
    want = encode_frames(frames, CodecOptions(codec="h264", gop=2, crf=20, fast_decode=True)).data
    assert _front_packets(fast, "ep0001") == [bytes(p) for p in want]
    assert _front_packets(plain, "ep0001") != _front_packets(fast, "ep0001")
    assert json.loads((fast / "index.json").read_text())["options"]["fast_decode"] is True
    assert "fast_decode" not in json.loads((plain / "index.json").read_text())["options"]


def _luma_psnr(a, b):
    ya, yb = (cv2.cvtColor(np.ascontiguousarray(x), cv2.COLOR_RGB2YUV)[..., 0].astype(np.float64) for x in (a, b))
    return 10 * np.log10(255 ** 2 / np.mean((ya - yb) ** 2))


def test_video_pipe_reads_fast_decode_shards_within_the_psnr_bound(src, tmp_path):
    out = _write(src, tmp_path / "out", "--fast-decode")
    got = [(int(f), img.numpy().transpose(1, 2, 0)) for b in video_pipe(out, episodes=["ep0002"], batch_size=4,
                                                                        max_batches=100)
           for f, img, v in zip(b["frame"], b["front"], b["valid"]) if v]
    source = list(READER.read("ep0002").cameras["front"])
    assert [f for f, _ in got] == list(range(8))
    psnr = [_luma_psnr(img, np.asarray(source[f])) for f, img in got]
    assert min(psnr) >= 35.0, psnr


@pytest.mark.parametrize("codec", ["jpeg", "av1", "copy"])
def test_fast_decode_is_refused_for_other_codecs_in_one_line(src, tmp_path, capsys, codec):
    assert main(["write", str(src), str(tmp_path / "o"), "--codec", codec, "--fast-decode"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--fast-decode" in err and "--codec h264" in err and f"--codec {codec}" in err
    assert not (tmp_path / "o").exists()


def test_write_options_refuse_fast_decode_for_other_codecs_by_name():
    for codec in ("jpeg", "av1", "copy"):
        with pytest.raises(ValueError, match="fast_decode=True"):
            WriteOptions(format="raw", codec=codec, fast_decode=True)
    assert WriteOptions(format="raw", codec="h264", fast_decode=True).to_dict()["fast_decode"] is True


class _Crash(RuntimeError):
    pass


class _CrashingRaw:
    """The raw reader of ``src``, failing on the first episode read: the write stops unfinished."""

    def __init__(self, src):
        self.inner = FORMATS["raw"].factory(src)

    def episode_ids(self):
        return self.inner.episode_ids()

    def read(self, episode_id):
        raise _Crash


@pytest.mark.parametrize("first", [True, False])
def test_a_resume_with_another_fast_decode_is_refused_naming_it(src, tmp_path, capsys, first):
    out = tmp_path / "out"
    opts = WriteOptions(format="raw", codec="h264", gop=2, crf=20, fast_decode=first)
    with pytest.raises(_Crash):
        write_shards(_CrashingRaw(src), out, opts, workers=1)
    again = () if first else ("--fast-decode",)
    assert main(["write", str(src), str(out), "--workers", "1", "--codec", "h264", "--gop", "2", "--crf", "20",
                 *again]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "other options (differ: fast_decode, source)" in err
    same = ("--fast-decode",) if first else ()
    assert main(["write", str(src), str(out), "--workers", "1", "--codec", "h264", "--gop", "2", "--crf", "20",
                 *same]) == 0  # the same setting resumes
    assert EpisodeIndex.open(out).options.get("fast_decode", False) is first


def test_merging_jobs_written_with_and_without_fast_decode_is_refused(src, tmp_path, capsys):
    out = tmp_path / "out"
    for index, extra in ((0, ("--fast-decode",)), (1, ())):
        _write(src, out, "--num-jobs", "2", "--job-index", str(index), *extra)
    capsys.readouterr()
    assert main(["merge", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "was written with other options than" in err
    assert not (out / "index.json").exists()
