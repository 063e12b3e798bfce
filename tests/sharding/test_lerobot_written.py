"""Datasets written by LeRobot's own writer (tests/data/lerobot_written, lerobot 0.4.4: AV1 at its defaults, and h264
with streaming encoding over several mp4s a camera), indexed in place (``--codec reference``) and imported
(``--codec copy``): every pipe gives, frame by frame, what PyAV decodes from the mp4 at the episode's place in it and
what ``LeRobotDataset(video_backend="pyav")[i]`` returned (its digests, recorded by make.py), and the parquet's
arrays; a source file replaced after indexing is refused by name."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from helpers import decode_rgb

from episodepipes.errors import ShardIOError
from episodepipes.index import EpisodeIndex
from episodepipes.pipes import metric_pipe, video_pipe
from episodepipes.pipes.train import train_pipe
from episodepipes.sharding.cli import main

DATA = Path(__file__).resolve().parent.parent / "data" / "lerobot_written"
KEYS = ("observation.images.front", "observation.images.wrist")
CAMS = [k.replace(".", "_") for k in KEYS]
NAMES = ("av1", "h264")


class Truth:
    """A fixture dataset's ground truth: PyAV's frames, LeRobot's digests, the parquet's arrays."""

    def __init__(self, root: Path) -> None:
        info = json.loads((root / "meta/info.json").read_text())
        fps = info["fps"]
        meta = pq.read_table(root / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
        self.lengths = {m["episode_index"]: m["length"] for m in meta}
        self.frames: dict[tuple[int, int, str], np.ndarray] = {}
        decoded: dict[Path, list] = {}
        for key, cam in zip(KEYS, CAMS):
            for m in meta:
                path = root / info["video_path"].format(video_key=key, chunk_index=m[f"videos/{key}/chunk_index"],
                                                        file_index=m[f"videos/{key}/file_index"])
                if path not in decoded:
                    decoded[path] = decode_rgb(path)
                frames = decoded[path]
                first = round(m[f"videos/{key}/from_timestamp"] * fps)
                self.frames.update({(m["episode_index"], t, cam): frames[first + t] for t in range(m["length"])})
        self.files = len(decoded)
        data = pq.read_table(root / "data/chunk-000/file-000.parquet").to_pydict()
        self.arrays = {(e, t): {"observation_state": np.asarray(s, np.float32), "action": np.asarray(a, np.float32)}
                       for e, t, s, a in zip(data["episode_index"], data["frame_index"], data["observation.state"],
                                             data["action"])}
        self.lerobot = {(s["episode_index"], s["frame_index"]): s
                        for s in json.loads((root / "lerobot.json").read_text())["samples"]}

    def check_frame(self, e: int, t: int, cam: str, img: np.ndarray) -> None:
        assert np.array_equal(img, self.frames[e, t, cam]), (e, t, cam)
        key = KEYS[CAMS.index(cam)]
        assert hashlib.sha256(np.ascontiguousarray(img).tobytes()).hexdigest() == self.lerobot[e, t][key], (e, t, cam)


@pytest.fixture(scope="module", params=NAMES)
def dataset(request, tmp_path_factory):
    src = DATA / request.param
    out = tmp_path_factory.mktemp(f"lw-{request.param}")
    for codec in ("reference", "copy"):
        assert main(["write", str(src), str(out / codec), "--format", "lerobot", "--codec", codec,
                     "--shard-size", "40kB"]) == 0
    return request.param, src, out, Truth(src)


def _hwc(img) -> np.ndarray:  # noqa: ANN001
    return img.numpy().transpose(1, 2, 0)


def _number(eid: str) -> int:
    return int(eid.rsplit("_", 1)[1])


def test_the_fixture_is_lerobots_own_writing_and_reading(dataset):
    name, src, _, truth = dataset
    stamp = json.loads((src / "lerobot.json").read_text())
    assert stamp["versions"]["lerobot"] == "0.4.4" and stamp["video_backend"] == "pyav"
    codec = json.loads((src / "meta/info.json").read_text())["features"][KEYS[0]]["info"]["video.codec"]
    assert codec == name
    if name == "h264":  # streaming encoding's episodes split over several files a camera, several in each
        assert truth.files == 4 and len(truth.lengths) == 6
    assert truth.lerobot.keys() == truth.arrays.keys() == {(e, t) for e, n in truth.lengths.items() for t in range(n)}
    for (e, t), s in truth.lerobot.items():  # PyAV's frames are LeRobot's, its arrays the parquet's
        for key, cam in zip(KEYS, CAMS):
            assert hashlib.sha256(truth.frames[e, t, cam].tobytes()).hexdigest() == s[key]
        assert np.array_equal(np.asarray(s["action"], np.float32), truth.arrays[e, t]["action"])


@pytest.mark.parametrize("codec", ["reference", "copy"])
def test_every_pipe_gives_lerobots_frames_and_the_parquet_arrays(dataset, codec):
    name, src, out, truth = dataset
    index = EpisodeIndex.open(out / codec, source_root=src)
    assert sorted(_number(e.id) for e in index.episodes) == sorted(truth.lengths)
    if codec == "reference":
        assert not list((out / codec).glob("*.tar"))
    seen = 0
    for b in video_pipe(index, episodes=[e.id for e in index.episodes], batch_size=7, max_batches=10**6):
        for j, (eid, f, v) in enumerate(zip(b["episode"], b["frame"], b["valid"])):
            assert v
            e, t = _number(eid), int(f)
            for cam in CAMS:
                truth.check_frame(e, t, cam, _hwc(b[cam][j]))
            for k, want in truth.arrays[e, t].items():
                assert np.array_equal(b[k][j].numpy(), want), (e, t, k)
            seen += 1
    assert seen == len(truth.lerobot)
    sparse = 0
    for b in metric_pipe(index, split="train", frames_per_episode=3, batch_size=4, num_workers=2):
        for j, (eid, f) in enumerate(zip(b["episode"], b["frame"])):
            for cam in CAMS:
                truth.check_frame(_number(eid), int(f), cam, _hwc(b[cam][j]))
            sparse += 1
    assert sparse == 3 * len(truth.lengths)
    pipe = train_pipe(index, split="train", batch_size=4, seed=1, epochs=1, num_workers=2,
                      history={CAMS[0]: 2}, horizon={"action": 16})
    trained = set()
    for b in pipe:
        for j, (eid, f) in enumerate(zip(b["episode"], b["frame"])):
            e, t = _number(eid), int(f)
            n = truth.lengths[e]
            for k, img in enumerate(b[CAMS[0]][j]):  # steps t-1, t (t-1 padded by step 0 at the start)
                truth.check_frame(e, max(t - 1 + k, 0), CAMS[0], _hwc(img))
            truth.check_frame(e, t, CAMS[1], _hwc(b[CAMS[1]][j]))
            for k in range(16):  # the parquet's actions, the last one repeated past the episode's end
                assert np.array_equal(b["action"][j][k].numpy(), truth.arrays[e, min(t + k, n - 1)]["action"])
            trained.add((e, t))
    assert len(trained) == len(pipe) * 4 > len(truth.lerobot) - 4  # one epoch: every frame but the drop-last


def test_verify_and_info_read_the_index_in_place(dataset, capsys):
    _, src, out, truth = dataset
    ref = out / "reference"
    assert main(["verify", str(ref), "--source-root", str(src)]) == 0
    assert main(["info", str(ref)]) == 0
    said = capsys.readouterr().out
    assert f"{sum(truth.lengths.values())} (train " in said and "virtual" in said
    r, c = EpisodeIndex.open(ref, source_root=src), EpisodeIndex.open(out / "copy")
    r.verify()
    assert r.problems(members=True) == []
    for col in ("offset", "size", "crc32", "member", "key"):  # the in-place index is the copy import's
        assert np.array_equal(r.tables.columns[col], c.tables.columns[col]), col


def test_a_source_file_replaced_after_indexing_is_refused(dataset, tmp_path):
    name, src, out, _ = dataset
    mine = tmp_path / name
    shutil.copytree(src, mine)
    assert main(["write", str(mine), str(tmp_path / "ref"), "--format", "lerobot", "--codec", "reference"]) == 0
    victim = sorted((mine / "videos" / KEYS[1]).rglob("*.mp4"))[-1]
    other = sorted((src / "videos" / KEYS[0]).rglob("*.mp4"))[-1]  # another camera's file: a valid mp4
    victim.write_bytes(other.read_bytes())
    index = EpisodeIndex.open(tmp_path / "ref", source_root=mine)
    with pytest.raises(ShardIOError, match="changed after it was indexed") as e:
        list(video_pipe(index, episodes=[e.id for e in index.episodes], batch_size=8, max_batches=10**6))
    assert victim.relative_to(mine).as_posix() in str(e.value)
