"""Episode attributes end to end: a reader's extra metadata -> the index -> `Episode.meta` -> ``where=``."""

import dataclasses
import json

import numpy as np
import pytest
import torch
import zarr
from helpers import as_v1, write_raw, write_zarr

from episodepipes.index import EpisodeIndex
from episodepipes.index.check import IndexFormatError
from episodepipes.pipes import metric_pipe, train_pipe, video_pipe
from episodepipes.pipes.select import attributes
from episodepipes.sharding.cli import main
from episodepipes.sharding.episode import EpisodeError
from episodepipes.sharding.formats.synthetic import SyntheticReader
from episodepipes.sharding.formats.zarr_reader import ZarrReader
from episodepipes.sharding.upgrade import upgrade
from episodepipes.sharding.write.encode import EncodeOptions, encode_episode
from episodepipes.sharding.write.writer import ShardWriter

READER = SyntheticReader(num_episodes=6, length=5, height=24, width=32)  # val: ep0002, ep0005


def _robot(n):
    return "franka" if n % 2 == 0 else "ur5"


def _raw_with_meta(src, extra=None):
    """Raw folders whose meta.json carries ``robot`` and ``success`` beside fps, prompt and split."""
    write_raw(src, READER)
    for n, eid in enumerate(READER.episode_ids()):
        f = src / eid / "meta.json"
        f.write_text(json.dumps({**json.loads(f.read_text()), "robot": _robot(n), "success": n < 3,
                                 **(extra or {})}))
    return src


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    root = tmp_path_factory.mktemp("attrs")
    src, out = _raw_with_meta(root / "src"), root / "out"
    assert main(["write", str(src), str(out), "--workers", "1"]) == 0
    return out


def test_raw_meta_keys_reach_the_index_and_every_builder_filters_on_them(written, capsys):
    index = EpisodeIndex.open(written)
    for n, e in enumerate(index.episodes):
        assert e.meta == {"robot": _robot(n), "success": n < 3}
        assert attributes(e)["robot"] == _robot(n) and attributes(e)["split"] == e.split
    frankas = {e.id for e in index.episodes if e.meta["robot"] == "franka"}
    pipe = metric_pipe(written, frames_per_episode=2, batch_size=4, rank=0, world_size=1,
                       where=lambda a: a["robot"] == "franka")
    assert {e for b in pipe for e in b["episode"]} == {"ep0002"} == frankas & {"ep0002", "ep0005"}
    train = train_pipe(written, batch_size=2, seed=0, rank=0, world_size=1,
                       where=lambda a: a["robot"] == "franka" and a["success"])
    assert {e for b in train for e in b["episode"]} == {"ep0000"}  # franka with success: ep0000 (ep0002 is val)
    video = video_pipe(written, batch_size=5, max_batches=10, where=lambda a: not a["success"])
    assert [b["episode"][0] for b in video] == ["ep0003", "ep0004", "ep0005"]
    assert main(["info", str(written), "--episodes"]) == 0
    out = capsys.readouterr().out
    assert "attributes" in out.splitlines()[-7]
    assert 'robot="franka" success=true' in next(ln for ln in out.splitlines() if ln.startswith("ep0000"))
    assert 'robot="ur5" success=false' in next(ln for ln in out.splitlines() if ln.startswith("ep0005"))


def test_v1_and_upgraded_indexes_keep_the_attributes(written, tmp_path):
    import shutil

    copy = tmp_path / "v1"
    shutil.copytree(written, copy)
    as_v1(copy)
    v1 = EpisodeIndex.open(copy)
    assert v1.version == 1 and [e.meta for e in v1.episodes] == [e.meta for e in EpisodeIndex.open(written).episodes]
    up = upgrade(copy)
    assert up.version == 2 and [e.meta["robot"] for e in up.episodes] == [_robot(n) for n in range(6)]


def test_zarr_attrs_become_attributes_and_builtin_named_ones_are_left_out(tmp_path):
    src = write_zarr(tmp_path / "src", READER)
    for n, eid in enumerate(READER.episode_ids()):
        zarr.open_group(str(src / f"{eid}.zarr"), mode="r+").attrs.update(
            {"robot": _robot(n), "task_id": n, "length": 99, "scene": {"table": 2}})
    reader = ZarrReader(src)
    with ShardWriter(tmp_path / "out", shard_size=1 << 20, options={"jpeg_quality": 90}) as w:
        for eid in reader.episode_ids():
            w.add(encode_episode(reader.read(eid), EncodeOptions()))
    index = EpisodeIndex.open(tmp_path / "out")
    assert [e.meta for e in index.episodes] == [{"robot": _robot(n), "task_id": n} for n in range(6)]
    assert [e.length for e in index.episodes] == [5] * 6
    pipe = metric_pipe(index, frames_per_episode=1, batch_size=4, rank=0, world_size=1,
                       where=lambda a: a["task_id"] == 5)
    assert [e for b in pipe for e in b["episode"]] == ["ep0005"]


def test_lerobot_robot_type_becomes_an_attribute(tmp_path):
    from benchmarks.lerobot_data import available_encoders, make_lerobot
    from episodepipes.sharding.formats.lerobot import LeRobotReader

    make_lerobot(tmp_path / "lr", num_episodes=2, length=6, encoder=available_encoders()[0])
    reader = LeRobotReader(tmp_path / "lr")
    with ShardWriter(tmp_path / "out", shard_size=1 << 20, options={"jpeg_quality": 90}) as w:
        for eid in reader.episode_ids():
            w.add(encode_episode(reader.read(eid), EncodeOptions()))
    index = EpisodeIndex.open(tmp_path / "out")
    assert [e.meta for e in index.episodes] == [{"robot_type": "synthetic"}] * 2
    assert all(e.prompt for e in index.episodes)  # the tasks are the prompt
    info = json.loads((tmp_path / "lr/meta/info.json").read_text())
    (tmp_path / "lr/meta/info.json").write_text(json.dumps({**info, "robot_type": ["a", "b"]}))
    with pytest.raises(ValueError, match=r"info.json: robot_type=.*must be a string or null"):
        LeRobotReader(tmp_path / "lr")


@pytest.mark.parametrize("extra, needle", [
    ({"length": 3}, "attribute 'length' is a built-in episode field"),
    ({"note": "x" * 2000}, "attribute 'note' holds 2000 characters"),
    ({"big": 2**64}, "attribute 'big' is an integer outside the int64 range"),
    ({f"k{i}": i for i in range(70)}, "more than 64"),
])
def test_the_writer_refuses_what_the_index_would_refuse(tmp_path, capsys, extra, needle):
    src = _raw_with_meta(tmp_path / "src", extra)
    assert main(["write", str(src), str(tmp_path / "out"), "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1 and "episode 'ep0000'" in err and needle in err, err
    assert not (tmp_path / "out" / "index.json").exists()
    with pytest.raises(EpisodeError, match=needle):
        dataclasses.replace(READER.read("ep0000"), extra=extra)  # any reader's EpisodeData checks the same


def _hostile(written, tmp_path, attrs):
    import shutil

    copy = tmp_path / "h"
    shutil.copytree(written, copy)
    data = json.loads((copy / "index.json").read_text())
    data["attrs"][int(np.load(copy / "index.attr.npy")[1])] = attrs  # episode 1's attribute set
    (copy / "index.json").write_text(json.dumps(data))
    return copy


@pytest.mark.parametrize("attrs, needle", [
    ({"scene": {"table": 2}}, "attribute 'scene' is a dict"),
    ({"scene": [1, 2]}, "attribute 'scene' is a list"),
    ({"note": "x" * 100_000}, "attribute 'note' holds 100000 characters"),
    ({"n": 10**30}, "attribute 'n' is an integer outside the int64 range"),
    ({"x": float("nan")}, "attribute 'x'=nan is not a finite number"),
    ({"": 1}, "attribute name '' should be text"),
    ({f"k{i}": 0 for i in range(100)}, "has 100 attributes, more than 64"),
])
def test_a_hostile_index_attribute_is_refused_by_name(written, tmp_path, attrs, needle):
    with pytest.raises(IndexFormatError, match=rf"index.json is damaged: episode 'ep0001': episode_meta .*{needle}"):
        EpisodeIndex.open(_hostile(written, tmp_path, attrs))


def test_a_hostile_v1_attribute_is_refused_by_name(written, tmp_path):
    copy = as_v1(_hostile(written, tmp_path, {"robot": "ur5"}))
    data = json.loads((copy / "index.json").read_text())
    data["episodes"][1]["scene"] = {"table": [2] * 1000}
    (copy / "index.json").write_text(json.dumps(data))
    with pytest.raises(IndexFormatError, match=r"damaged: episode 'ep0001': attribute 'scene' is a dict"):
        EpisodeIndex.open(copy)


def test_attributes_do_not_change_the_batches(written, tmp_path):
    """Attributes are index metadata only: the same frames as a source without them."""
    plain_src = write_raw(tmp_path / "src", READER)
    assert main(["write", str(plain_src), str(tmp_path / "out"), "--workers", "1"]) == 0
    kw = dict(frames_per_episode=3, batch_size=4, rank=0, world_size=1)
    for a, b in zip(metric_pipe(written, **kw), metric_pipe(tmp_path / "out", **kw), strict=True):
        assert torch.equal(a["front"], b["front"]) and torch.equal(a["state"], b["state"])


def test_two_jobs_merged_keep_the_attributes_byte_for_byte(tmp_path):
    src = _raw_with_meta(tmp_path / "src")
    common = ["--shard-size", "15kB", "--workers", "1"]
    assert main(["write", str(src), str(tmp_path / "one"), *common]) == 0
    for i in (0, 1):
        assert main(["write", str(src), str(tmp_path / "two"), *common, "--num-jobs", "2", "--job-index", str(i)]) == 0
    assert main(["merge", str(tmp_path / "two")]) == 0
    assert (tmp_path / "two" / "index.json").read_bytes() == (tmp_path / "one" / "index.json").read_bytes()
    assert [e.meta["robot"] for e in EpisodeIndex.open(tmp_path / "two").episodes] == [_robot(n) for n in range(6)]


def test_three_jobs_merged_in_place_write_the_id_columns_of_one_write(tmp_path):
    """The in-place merge builds ids, id_order and attr from its jobs' columns: job 1 meets a set job 0 made first
    and one of its own, so its codes are remapped, and the merged columns and attrs are a single write's, bytes."""
    from episodepipes.format import COLUMNS, INDEX_NAME

    src = _raw_with_meta(tmp_path / "src")
    common = ["--shard-size", "15kB", "--workers", "1"]
    assert main(["write", str(src), str(tmp_path / "one"), *common]) == 0
    for i in range(3):
        assert main(["write", str(src), str(tmp_path / "m"), *common, "--num-jobs", "3", "--job-index", str(i)]) == 0
    assert main(["merge", str(tmp_path / "m")]) == 0
    for name in ("ids", "id_order", "attr"):
        file = COLUMNS[name][0]
        assert (tmp_path / "m" / file).read_bytes() == (tmp_path / "one" / file).read_bytes(), name
    merged, one = (json.loads((tmp_path / d / INDEX_NAME).read_text()) for d in ("m", "one"))
    assert "ids" not in merged and "episode_meta" not in merged
    assert merged["attrs"] == one["attrs"] and len(merged["attrs"]) == 5  # {} and four sets, each once
    assert merged["columns"].keys() == one["columns"].keys()
    index = EpisodeIndex.open(tmp_path / "m")  # its own checks of the id columns pass
    index.verify()
    assert list(index.ids) == list(EpisodeIndex.open(tmp_path / "one").ids)
    assert [e.meta["robot"] for e in index.episodes] == [_robot(n) for n in range(6)]
    assert [e.meta["success"] for e in index.episodes] == [n < 3 for n in range(6)]


def test_the_built_in_names_are_the_index_entry_fields(written):
    """What where= sees besides the attributes: every built-in name the writer keeps attributes from."""
    from episodepipes import episode_attrs

    seen = attributes(EpisodeIndex.open(written).episodes[0])
    assert set(episode_attrs.BUILTIN) - {"segments"} <= set(seen)  # so no attribute may take one of these names
