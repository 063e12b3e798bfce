"""Hostile LeRobot metadata that the path templates' own checks do not see: a video feature *key* that climbs out of
the root through ``{video_key}``, a robot_type too long to be an attribute, number tokens JSON turns into inf.
Each is refused in one line naming the file and the field (the CLI: exit 2), before any video is opened."""

import json
import shutil

import pyarrow.parquet as pq
import pytest

from benchmarks.lerobot_data import VIDEO_KEYS, available_encoders, make_lerobot
from episodepipes.sharding import cli
from episodepipes.sharding.formats.lerobot import LeRobotReader

META = "meta/episodes/chunk-000/file-000.parquet"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("lerobot_meta") / "lr"
    make_lerobot(root, num_episodes=2, length=3, height=32, width=48, encoder=available_encoders(("h264",))[0],
                 image_feature=False)
    return root


@pytest.fixture
def src(dataset, tmp_path):
    shutil.copytree(dataset, tmp_path / "lr")
    return tmp_path / "lr"


def _info(src, edit):
    path = src / "meta/info.json"
    info = json.loads(path.read_text())
    edit(info)
    path.write_text(json.dumps(info))


def _rename_video_key(src, old, new):
    """The feature in info.json and its columns in meta/episodes, renamed alike: a consistent crafted dataset."""
    _info(src, lambda info: info["features"].update({new: info["features"].pop(old)}))
    t = pq.read_table(src / META)
    pq.write_table(t.rename_columns([c.replace(f"videos/{old}/", f"videos/{new}/") for c in t.column_names]),
                   src / META)


@pytest.mark.parametrize(("key", "match"), [
    ("cam/../../../outside", r"meta/episodes/chunk-000/file-000.parquet episode_index 0: video_path: path "
                             r"'videos/cam/\.\./\.\./\.\./outside/.*' must be relative to the dataset root"),
    ("../escape", r"meta/info.json: name '\.\./escape' becomes the shard field '___escape', which is reserved"),
])
def test_a_video_key_that_climbs_through_the_template_is_refused_by_name(src, capsys, key, match):
    _rename_video_key(src, VIDEO_KEYS[0], key)
    (src.parent / "outside").mkdir()
    with pytest.raises(ValueError, match=match) as e:
        LeRobotReader(src)
    assert "\n" not in str(e.value)
    assert cli.main(["write", str(src), str(src.parent / "out"), "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not (src.parent / "out" / "index.json").exists()


def test_a_robot_type_too_long_for_an_attribute_fails_the_write_in_one_line(src, capsys):
    _info(src, lambda info: info.update(robot_type="x" * 5000))
    assert cli.main(["write", str(src), str(src.parent / "out"), "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "attribute 'robot_type' holds 5000 characters, more than 1024" in err, err


@pytest.mark.parametrize("token", ["1e400", "-1e400", "NaN"])
def test_fps_tokens_json_reads_as_inf_or_nan_are_refused(src, token):
    path = src / "meta/info.json"
    path.write_text(path.read_text().replace('"fps": 10', f'"fps": {token}', 1))
    with pytest.raises(ValueError, match=r"meta/info.json: fps=(-?inf|nan) must be a finite number > 0"):
        LeRobotReader(src)


@pytest.mark.parametrize("what", ["fifo", "link_to_fifo"])
def test_a_zarr_chunk_that_is_no_regular_file_is_refused_before_zarr_opens_it(tmp_path, capsys, what):
    import os

    from helpers import write_zarr

    from episodepipes.sharding.episode import EpisodeError
    from episodepipes.sharding.formats.synthetic import SyntheticReader
    from episodepipes.sharding.formats.zarr_reader import ZarrReader

    src = write_zarr(tmp_path / "src", SyntheticReader(num_episodes=1, length=4, height=16, width=24))
    chunk = src / "ep0000.zarr/action/c/0/0"
    chunk.unlink()
    if what == "fifo":
        os.mkfifo(chunk)
    else:  # a link to a FIFO that stays inside SRC: followed, and refused for what it is
        os.mkfifo(src / "pipe")
        chunk.symlink_to(src / "pipe")
    with pytest.raises(EpisodeError, match=rf"^episode 'ep0000': {chunk} is not a regular file \(a FIFO or device in "
                                           r"the store\); replace it"):
        ZarrReader(src).read("ep0000")
    assert cli.main(["write", str(src), str(tmp_path / "out"), "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(chunk) in err


@pytest.mark.parametrize("what", ["fifo", "dev_null", "broken_link"])
def test_a_raw_video_that_is_no_regular_file_is_refused_not_dropped(tmp_path, capsys, what):
    """Skipped, the camera would silently go missing from the episode; named, the fix is clear."""
    import os

    from helpers import write_raw

    from episodepipes.sharding.episode import EpisodeError
    from episodepipes.sharding.formats.raw import RawReader
    from episodepipes.sharding.formats.synthetic import SyntheticReader

    src = write_raw(tmp_path / "src", SyntheticReader(num_episodes=1, length=4, height=16, width=24))
    video = src / "ep0000" / "side.mp4"
    {"fifo": lambda: os.mkfifo(video), "dev_null": lambda: video.symlink_to("/dev/null"),
     "broken_link": lambda: video.symlink_to(src / "ep0000" / "gone.mp4")}[what]()
    with pytest.raises(EpisodeError, match=rf"^episode 'ep0000': {video} is not a regular file"):
        RawReader(src).read("ep0000")
    assert cli.main(["write", str(src), str(tmp_path / "out"), "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(video) in err
