"""Numbers too large for a float where a finite float is wanted (an fps, seconds): JSON reads ``1e400`` as inf, which
was refused, but ``1`` and 400 zeros as an exact int, which ``math.isfinite`` cannot take (OverflowError). Each is
refused in the one line of the field's own check, and the CLI exits 2 without a traceback."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from helpers import as_v1, write_raw

from benchmarks.lerobot_data import available_encoders, make_lerobot
from episodepipes.index import EpisodeIndex, IndexFormatError
from episodepipes.sharding.cli import main
from episodepipes.sharding.episode import EpisodeData, EpisodeError
from episodepipes.sharding.formats.lerobot import LeRobotReader
from episodepipes.sharding.formats.raw import RawReader
from episodepipes.sharding.formats.synthetic import SyntheticReader

HUGE = 10**400  # an int JSON reads exactly (and writes back as 1 and 400 zeros)


@pytest.fixture(scope="module")
def shards(shard_folder):
    return shard_folder("numbers", num_episodes=2, length=4, height=16, width=24)


def _edit(path, change):
    d = json.loads(path.read_text())
    change(d)
    path.write_text(json.dumps(d))


@pytest.mark.parametrize("version", [1, 2])
def test_an_index_fps_too_large_for_a_float_is_refused_by_name(shards, tmp_path, capsys, version):
    out = shutil.copytree(shards, tmp_path / "s")
    if version == 1:
        as_v1(out)
        _edit(out / "index.json", lambda d: d["episodes"][0].update(fps=HUGE))
    else:
        _edit(out / "index.json", lambda d: d["fps"].__setitem__(0, HUGE))
    with pytest.raises(IndexFormatError) as e:  # OverflowError: int too large to convert to float
        EpisodeIndex.open(out)
    assert "fps=1000" in str(e.value) and "\n" not in str(e.value)
    capsys.readouterr()
    assert main(["info", str(out)]) == 2
    err = capsys.readouterr().err
    assert "fps=1000" in err and "Traceback" not in err


def test_a_raw_meta_fps_too_large_for_a_float_is_refused_by_name(tmp_path):
    src = write_raw(tmp_path / "src", SyntheticReader(num_episodes=1, length=3, height=16, width=24))
    meta = next(src.rglob("meta.json"))
    _edit(meta, lambda d: d.update(fps=HUGE))
    with pytest.raises(EpisodeError) as e:
        RawReader(src).read(meta.parent.name)
    assert "fps=1000" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(EpisodeError, match="fps="):
        EpisodeData("e", {"c": []}, {}, HUGE)


@pytest.fixture(scope="module")
def lerobot(tmp_path_factory):
    root = tmp_path_factory.mktemp("lerobot") / "lr"
    make_lerobot(root, num_episodes=1, length=3, height=32, width=48, encoder=available_encoders(("h264",))[0])
    return root


def test_a_lerobot_fps_or_tolerance_too_large_for_a_float_is_refused_by_name(lerobot, tmp_path, capsys):
    src = shutil.copytree(lerobot, tmp_path / "lr")
    with pytest.raises(ValueError, match=r"^tolerance_s=1000"):
        LeRobotReader(src, tolerance_s=HUGE)
    _edit(src / "meta/info.json", lambda d: d.update(fps=HUGE))
    with pytest.raises(ValueError) as e:
        LeRobotReader(src)
    assert "info.json" in str(e.value) and "fps=1000" in str(e.value) and "\n" not in str(e.value)
    capsys.readouterr()
    assert main(["write", str(src), str(tmp_path / "out"), "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert "fps=1000" in err and "Traceback" not in err


def test_a_video_fps_too_large_for_a_float_is_refused_by_name(tmp_path):
    from episodepipes.lightning_glue.mp4 import AtomicMp4

    with pytest.raises(ValueError, match=r"^fps=1000"):
        AtomicMp4(tmp_path / "v.mp4", fps=HUGE)
    assert list(tmp_path.iterdir()) == []


def _camera(d, version):
    return next(iter((d["episodes"][0] if version == 1 else d["schemas"][0])["cameras"].values()))


SIZES = {  # field -> (change, what the refusal names); each reached the pipes, or a float conversion, unbounded
    "camera height 10**5": (lambda d, v: _camera(d, v).update(height=10**5), "height=100000"),  # 30 GB a frame
    "camera width 2**40": (lambda d, v: _camera(d, v).update(width=2**40), "width=1099511627776"),
    "camera source_height 10**400": (lambda d, v: _camera(d, v).update(source_height=HUGE, source_width=8),
                                     "source_height=1000"),
    "shard samples 10**400": (lambda d, v: d["shards"][0].update(samples=HUGE), "samples=1000"),
    "shard bytes 2**64": (lambda d, v: d["shards"][0].update(bytes=2**64), "bytes=18446744073709551616"),
}


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("case", sorted(SIZES))
def test_an_index_size_past_any_shard_or_camera_is_refused_at_open(shards, tmp_path, case, version):
    out = shutil.copytree(shards, tmp_path / "s")
    if version == 1:
        as_v1(out)
    change, needle = SIZES[case]
    _edit(out / "index.json", lambda d: change(d, version))
    with pytest.raises(IndexFormatError) as e:  # a pipe allocated (3, h, w) frames: ENOMEM, or an OverflowError
        EpisodeIndex.open(out)
    assert needle in str(e.value) and "\n" not in str(e.value)


def _wide_action(d, version, n):
    arrays = (d["episodes"][1] if version == 1 else d["schemas"][0])["arrays"]
    arrays["action"]["shape"] = [n]


@pytest.mark.parametrize("version", [1, 2])
def test_an_array_step_larger_than_its_frame_is_refused_before_anything_is_allocated(shards, tmp_path, version):
    """A step of 10**6 float32 (4 MB) cannot lie in a frame of a few kB: the pipes allocated it per sample (as zeros
    for a frame they then counted corrupt), so a shape of 2**31 made every sample 8 GB."""
    out = shutil.copytree(shards, tmp_path / "s")
    if version == 1:
        as_v1(out)
    _edit(out / "index.json", lambda d: _wide_action(d, version, 10**6))
    if version == 1:  # every frame is checked at open
        with pytest.raises(IndexFormatError) as e:
            EpisodeIndex.open(out)
    else:  # per episode, before its first frame is read
        from episodepipes.pipes import metric_pipe

        EpisodeIndex.open(out)
        with pytest.raises(IndexFormatError) as e:
            next(iter(metric_pipe(out, frames_per_episode=2, batch_size=2, split="train")))
    msg = str(e.value)
    assert f"'ep000{version % 2}'" in msg and "fewer than one step of its arrays (4000036 bytes" in msg
    assert "\n" not in msg


@pytest.fixture(scope="module")
def lerobot_v21(tmp_path_factory):
    root = tmp_path_factory.mktemp("lerobot21") / "lr"
    make_lerobot(root, num_episodes=1, length=3, height=32, width=48, version="v2.1", image_feature=False,
                 encoder=available_encoders(("h264",))[0])
    return root


def _sparse_giant(path) -> None:
    """64 GiB that cost no disk (a sparse file): read whole, it asked for 64 GiB of memory."""
    os.truncate(path, 64 << 30)


def test_a_giant_lerobot_episodes_jsonl_is_refused_by_its_size(lerobot_v21, tmp_path):
    src = shutil.copytree(lerobot_v21, tmp_path / "lr")
    _sparse_giant(src / "meta/episodes.jsonl")
    with pytest.raises(ValueError) as e:
        LeRobotReader(src)
    assert "meta/episodes.jsonl" in str(e.value) and str(64 << 30) in str(e.value) and "\n" not in str(e.value)


def test_a_giant_lerobot_tasks_jsonl_is_refused_by_its_size(lerobot_v21, tmp_path):
    src = shutil.copytree(lerobot_v21, tmp_path / "lr")
    episodes = src / "meta/episodes.jsonl"
    lines = [json.loads(x) for x in episodes.read_text().splitlines() if x.strip()]
    episodes.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "tasks"}) + "\n" for r in lines))
    _sparse_giant(src / "meta/tasks.jsonl")  # read for the tasks, which the episode lines no longer list
    reader = LeRobotReader(src)
    with pytest.raises(EpisodeError) as e:
        reader.read(reader.episode_ids()[0])
    assert "meta/tasks.jsonl" in str(e.value) and str(64 << 30) in str(e.value) and "\n" not in str(e.value)
