"""Hostile sources: frame rates no video container stores, LeRobot metadata whose episode count disagrees with its
episodes, and zarr stores whose metadata declares shapes they do not hold. Each is one line naming the episode or
file and the fix, before anything is allocated from what the file declares."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest
from helpers import as_v1, make_shards, write_raw, write_zarr

from benchmarks.lerobot_data import available_encoders, make_lerobot
from episodepipes.index import EpisodeIndex, IndexFormatError
from episodepipes.sharding.episode import EpisodeData, EpisodeError
from episodepipes.sharding.formats.lerobot import LeRobotReader
from episodepipes.sharding.formats.raw import RawReader
from episodepipes.sharding.formats.synthetic import SyntheticReader
from episodepipes.sharding.formats.zarr_reader import ZarrReader

RATES = [1e308, 1001, 1e-300, 0.0005]  # finite and positive, but no mp4 time scale holds them


def _edit(path, change):
    d = json.loads(path.read_text())
    change(d)
    path.write_text(json.dumps(d))


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return make_shards(tmp_path_factory.mktemp("fps") / "s", num_episodes=2, length=4, height=16, width=24)


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("fps", RATES)
def test_an_index_fps_no_container_stores_is_refused_at_open(shards, tmp_path, version, fps):
    out = shutil.copytree(shards, tmp_path / "s")
    if version == 1:
        as_v1(out)
        _edit(out / "index.json", lambda d: d["episodes"][0].update(fps=fps))
    else:
        _edit(out / "index.json", lambda d: d["fps"].__setitem__(0, fps))
    want = rf"fps={re.escape(repr(fps))} should be a number of frames per second from 0.001 to 1000"
    with pytest.raises(IndexFormatError, match=want) as e:
        EpisodeIndex.open(out)
    assert str(out / "index.json") in str(e.value) and "\n" not in str(e.value)


def test_the_bounds_themselves_are_frame_rates(shards, tmp_path):
    out = shutil.copytree(shards, tmp_path / "s")
    _edit(out / "index.json", lambda d: d.update(fps=[1000, 0.001]))
    assert EpisodeIndex.open(out).episodes[0].fps == 1000.0
    EpisodeData("e", {"c": []}, {}, 1000)
    EpisodeData("e", {"c": []}, {}, 0.001)


@pytest.mark.parametrize("fps", RATES)
def test_a_raw_meta_fps_no_container_stores_is_refused_naming_the_file(tmp_path, fps):
    src = write_raw(tmp_path / "src", SyntheticReader(num_episodes=1, length=3, height=16, width=24))
    meta = next(src.rglob("meta.json"))
    _edit(meta, lambda d: d.update(fps=fps))
    want = rf"fps={re.escape(repr(fps))} is not a positive, finite number of frames per second from 0.001 to 1000"
    with pytest.raises(EpisodeError, match=want) as e:
        RawReader(src).read(meta.parent.name)
    assert str(meta) in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(EpisodeError, match="fps="):
        EpisodeData("e", {"c": []}, {}, fps)


@pytest.mark.parametrize("fps", RATES)
def test_a_zarr_fps_no_container_stores_is_refused_naming_the_store(tmp_path, fps):
    import zarr

    src = write_zarr(tmp_path / "src", SyntheticReader(num_episodes=1, length=3, height=16, width=24))
    zarr.open_group(str(src / "ep0000.zarr"), mode="r+").attrs["fps"] = fps
    with pytest.raises(EpisodeError, match=rf"ep0000.zarr attrs: fps={re.escape(repr(fps))} is not a positive"):
        ZarrReader(src).read("ep0000")


@pytest.fixture(scope="module")
def lerobot(tmp_path_factory):
    root = tmp_path_factory.mktemp("lerobot") / "lr"
    make_lerobot(root, num_episodes=2, length=3, height=32, width=48, encoder=available_encoders(("h264",))[0],
                 episodes_per_file=1, image_feature=False)
    return root


@pytest.mark.parametrize("fps", RATES)
def test_a_lerobot_fps_no_container_stores_is_refused_naming_info_json(lerobot, tmp_path, fps):
    src = shutil.copytree(lerobot, tmp_path / "lr")
    _edit(src / "meta/info.json", lambda d: d.update(fps=fps))
    want = rf"json: fps={re.escape(repr(fps))} must be a finite number > 0 \(frames per second\) from 0.001 to 1000"
    with pytest.raises(ValueError, match=want):
        LeRobotReader(src)


@pytest.mark.parametrize("total", [1, 3, 0, "2", True])
def test_a_lerobot_total_episodes_that_disagrees_with_the_episodes_listed_is_refused(lerobot, tmp_path, total):
    src = shutil.copytree(lerobot, tmp_path / "lr")
    _edit(src / "meta/info.json", lambda d: d.update(total_episodes=total))
    with pytest.raises(ValueError, match=rf"info.json: total_episodes={total!r} but the episode metadata lists 2 "
                                         "episodes; .* re-download or re-convert") as e:
        LeRobotReader(src)
    assert "\n" not in str(e.value)


def test_a_lerobot_total_episodes_that_agrees_opens(lerobot):
    assert len(LeRobotReader(lerobot).episode_ids()) == json.loads((lerobot / "meta/info.json").read_text())[
        "total_episodes"] == 2


_ZARR_CHILD = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_DATA, (2 << 30, 2 << 30))
from pathlib import Path
from episodepipes.sharding.formats.zarr_reader import ZarrReader
try:
    ZarrReader(Path(sys.argv[1])).read("ep0000")
    out = "read"
except Exception as e:
    out = type(e).__name__ + ": " + str(e)
peak = next(int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmHWM"))  # kB, this exec only
print(json.dumps([out, peak]))
"""


def _zarr_src(tmp_path):
    return write_zarr(tmp_path / "src", SyntheticReader(num_episodes=1, length=4, height=16, width=24))


def _declare(src, array, shape):
    """Rewrite ``array``'s metadata to declare ``shape`` (its missing chunks read as the fill value: no disk)."""
    _edit(src / "ep0000.zarr" / array / "zarr.json", lambda d: d.update(shape=shape))


def _read_in_child(src):
    r = subprocess.run([sys.executable, "-c", _ZARR_CHILD, str(src)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


def test_a_zarr_array_declaring_far_more_steps_than_frames_is_refused_before_it_is_read(tmp_path):
    src = _zarr_src(tmp_path)
    _declare(src, "obs/state", [2**28, 7])  # 7 GiB of fill value
    message, maxrss_kb = _read_in_child(src)
    assert message.startswith("EpisodeError: episode 'ep0000': ") and "obs/state declares 268435456 steps" in message
    assert "images/front has 4 frames" in message and "\n" not in message
    assert maxrss_kb < 500_000, maxrss_kb  # was a 7 GiB allocation (a MemoryError under the limit)


def test_a_zarr_camera_declaring_more_frames_than_the_arrays_is_refused_before_a_frame_is_encoded(tmp_path):
    src = _zarr_src(tmp_path)
    _declare(src, "images/front", [2**20, 16, 24, 3])  # was read and encoded for minutes before the length check
    with pytest.raises(EpisodeError, match=r"images/wrist declares 4 frames but .*images/front has 1048576 frames"):
        ZarrReader(src).read("ep0000")


def test_a_zarr_store_declaring_more_than_memory_holds_is_refused_naming_it(tmp_path):
    src = _zarr_src(tmp_path)
    for array in ("obs/state", "action", "keypoints", "images/front", "images/wrist"):
        _edit(src / "ep0000.zarr" / array / "zarr.json", lambda d: d.update(shape=[2**40, *d["shape"][1:]]))
    with pytest.raises(EpisodeError, match=r"ep0000.zarr declares arrays of \d+\.\d GiB .* more than the") as e:
        ZarrReader(src).read("ep0000")
    assert "MemoryError" not in str(e.value) and "\n" not in str(e.value)


def test_a_zarr_camera_of_the_wrong_layout_is_refused_before_it_is_read(tmp_path):
    src = _zarr_src(tmp_path)
    _declare(src, "images/wrist", [4, 16, 24, 2**30])  # 96 GiB of "channels"
    with pytest.raises(EpisodeError, match=r"images/wrist is uint8 \(4, 16, 24, 1073741824\); images must be uint8 "
                                           r"\(T, H, W, 3\)"):
        ZarrReader(src).read("ep0000")
