"""A raw episode's ``meta.json`` fps against its videos' own rate: a mismatch is refused by name (every timestamp
would be wrong), NTSC's rounding is not."""

import json

import pytest
from helpers import write_raw

from episodepipes.sharding.episode import EpisodeError
from episodepipes.sharding.formats.raw import RawReader
from episodepipes.sharding.formats.synthetic import SyntheticReader

READER = SyntheticReader(num_episodes=1, length=4, height=32, width=32, fps=30.0)


def _with_fps(tmp_path, fps):
    src = write_raw(tmp_path / "src", READER, video_cams=("front",))
    meta = src / "ep0000" / "meta.json"
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "fps": fps}))
    return src, meta


def test_a_meta_fps_that_disagrees_with_the_video_is_refused_naming_both(tmp_path):
    src, meta = _with_fps(tmp_path, 10)
    with pytest.raises(EpisodeError) as e:
        RawReader(src).read("ep0000")
    msg = str(e.value)
    for needle in ("episode 'ep0000'", str(meta), "fps 10", "front.mp4", "plays at 30 frames/s", '"fps": 30'):
        assert needle in msg, (needle, msg)


def test_ntsc_rounding_and_an_equal_rate_are_taken(tmp_path):
    src, _ = _with_fps(tmp_path, 30000 / 1001)  # 29.97 for a 30 fps file: the usual rounding, not an error
    assert RawReader(src).read("ep0000").fps == pytest.approx(29.97, abs=1e-2)
