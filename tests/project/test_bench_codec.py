"""The codec section's rows on tiny data: every row has numbers, and each says whether its goal is met."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.bench_codec import psnr
from benchmarks.codec_section import GOALS, ceiling, measure, write, yuv420_round_trip
from episodepipes.codec import CodecOptions
from episodepipes.sharding.formats.synthetic import SyntheticReader

pytestmark = pytest.mark.slow  # the benchmark harness: `pytest -m 'not slow'` leaves it out; `make test` runs it


def _episodes(n=3, length=12):
    r = SyntheticReader(num_episodes=n, length=length, height=64, width=96, cameras=("front",))
    return [np.stack(list(r.read(e).cameras["front"])) for e in r.episode_ids()]


def test_codec_section_gives_ceilings_pipes_and_goals_side_by_side(tmp_path):
    fast = CodecOptions(codec="h264", gop=4, crf=18, fast_decode=True)
    res = measure(tmp_path, _episodes(), {"h264 gop4 crf18": fast,
                                          "av1 gop2 crf30": CodecOptions(codec="av1", gop=2, crf=30)},
                  rounds=2, source="synthetic frames")
    storage, speed = ({row[0]: row for row in t["rows"]} for t in res["tables"])
    assert list(storage) == ["4:2:0 round trip, no codec loss", "jpeg q90", "h264 gop4 crf18", "av1 gop2 crf30"]
    assert {storage[k][-1] for k in ("h264 gop4 crf18", "av1 gop2 crf30")} <= {"met", "not met"}
    cols = res["tables"][1]["columns"]
    goal = {c: cols.index(c) for c in cols if c.startswith("goal")}
    assert speed["jpeg q90"][goal["goal >= 1.0x"]] == "–"  # the baseline has no goal of its own
    assert speed["av1 gop2 crf30"][goal["goal >= 0.5x at GOP 2"]] in ("met", "not met")
    assert speed["h264 gop4 crf18"][goal["goal >= 0.5x at GOP 2"]] == "–"  # the metric goal is at GOP 2 only
    for row in speed.values():
        assert all(row[i] in ("met", "not met", "–") for i in goal.values())
    rows = {r["metric"]: r for r in res["rows"]}
    for name in ("jpeg q90", "h264 gop4 crf18", "av1 gop2 crf30"):
        assert rows[f"{name}: decode ceiling, 2 threads"]["ours"] > 0
    for name in ("h264 gop4 crf18", "av1 gop2 crf30"):
        for kind in ("video_pipe (whole episodes)", "metric_pipe (12 random frames/episode)",
                     "train_pipe (history window of 4 frames)"):
            r = rows[f"{name}: {kind}"]
            assert r["ours"] > 0 and r["baseline"] > 0 and r["unit"] == "frames/s"
            assert r["note"].split(";")[0].endswith((": met", ": not met", ": not applicable (GOP 4)")), r["note"]
        assert rows[f"{name}: video_pipe (whole episodes)"]["ceiling"] == rows[f"{name}: decode ceiling, 2 threads"][
            "ours"]
        shard = rows[f"{name}: shard bytes"]
        assert 0 < shard["ours"] < shard["baseline"] and f">= {GOALS['storage']:.0f}x" in shard["note"]


def test_the_ceiling_decodes_every_frame_the_shards_hold_once(tmp_path):
    eps = _episodes(n=3, length=10)
    for codec, opts in ((None, {}), ("h264", {"codec": "h264", "gop": 4})):
        from episodepipes.sharding.write.encode import EncodeOptions

        _, payload, units = write(tmp_path / str(codec), eps, EncodeOptions(**opts))
        assert [len(u) for u in units] == [10, 10, 10] and payload > sum(map(len, sum(units, [])))
        for threads in (1, 2):
            fps, cpu = ceiling(units, codec, threads)  # it refuses a frame count other than the shards'
            assert fps > 0 and cpu > 0


def test_the_yuv420_round_trip_loses_rgb_more_than_luma_on_colour():
    frames = _episodes(n=1, length=3)
    rgb, luma = yuv420_round_trip(frames)
    assert 20 < rgb < luma < 100  # halving chroma costs the colour channels, far less the luma


def test_encoder_settings_the_writer_does_not_take_reach_the_shards_and_the_pipes(tmp_path):
    from episodepipes.codec import encode_frames
    from episodepipes.pipes import video_pipe
    from episodepipes.sharding.write.encode import EncodeOptions

    eps = _episodes(n=2, length=8)
    fast = CodecOptions(codec="h264", gop=4, crf=18, fast_decode=True)
    _, _, units = write(tmp_path / "fast", eps, fast)
    _, _, plain = write(tmp_path / "plain", eps, EncodeOptions(codec="h264", gop=4, crf=18))
    assert units == [encode_frames(ep, fast).data for ep in eps] != plain  # CAVLC, no deblocking: other bytes
    def quality(out):  # mean PSNR of what video_pipe returns
        got = [b["front"].numpy() for b in video_pipe(out, episodes=["ep000", "ep001"], batch_size=8, max_batches=9)]
        assert sum(map(len, got)) == 16
        return np.mean([psnr(a, b) for a, b in zip(np.concatenate(got).transpose(0, 2, 3, 1), np.concatenate(eps))])

    assert abs(quality(tmp_path / "fast") - quality(tmp_path / "plain")) < 1.0  # same crf, about the same quality


def test_the_sweep_gives_each_setting_its_decode_cost_beside_bytes_and_quality():
    from benchmarks.codec_sweep import codec_row, jpeg_row

    eps = _episodes(n=2, length=8)
    jpeg = jpeg_row(eps)
    plain = codec_row(eps, CodecOptions(codec="h264", gop=4, crf=18))
    fast = codec_row(eps, CodecOptions(codec="h264", gop=4, crf=18, fast_decode=True))
    assert len(jpeg) == 4 and len(plain) == len(fast) == 5
    assert all(r[-1] > 0 for r in (jpeg, plain, fast))  # CPU ms/frame of the bare decode
    assert fast[0] != plain[0] and abs(fast[1] - plain[1]) < 1.0  # other bytes, about the same quality
