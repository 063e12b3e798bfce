import json
import logging
import multiprocessing
import shutil
import tarfile
import threading

import cv2
import numpy as np
import pytest
import torch
from helpers import as_v1

from episodepipes.pipes import metric_pipe, video_pipe
from episodepipes.pipes.frames import reduced_flag


@pytest.fixture(scope="module")
def shards(shard_folder):
    return shard_folder("dec", num_episodes=3, length=10, height=48, width=64, shard_size=1 << 22)


def _jpegs(shards):
    with tarfile.open(shards / "shard-000000.tar") as tar:
        return {m.name: (m.offset_data, tar.extractfile(m).read()) for m in tar if m.name.endswith(".jpg")}


def _rgb(data, flag=cv2.IMREAD_COLOR):
    return cv2.imdecode(np.frombuffer(data, np.uint8), flag)[:, :, ::-1].transpose(2, 0, 1)


@pytest.mark.parametrize("method", ["thread", "process"])
def test_frames_match_cv2_decode_of_the_source_jpegs(shards, method):
    jpegs = _jpegs(shards)
    pipe = video_pipe(shards, episodes=["ep0002", "ep0000"], batch_size=3, max_batches=100, method=method)
    batches = list(pipe)  # kept alive: reused buffers must not overwrite them
    n = 0
    for b in batches:
        assert b["front"].dtype == b["wrist"].dtype == torch.uint8 and b["front"].shape[1:] == (3, 48, 64)
        for i, (e, f) in enumerate(zip(b["episode"], b["frame"].tolist())):
            for cam in ("front", "wrist"):
                np.testing.assert_array_equal(b[cam][i].numpy(), _rgb(jpegs[f"{e}/{f:06d}.{cam}.jpg"][1]))
            assert b["timestamp"][i].item() == pytest.approx(f / 10.0)
            n += 1
    assert n == 20 and pipe.stats["frames_decoded"] == 40 and pipe.stats["workers_started"] == 2


def test_resize_uses_reduced_decode_where_it_can(shards):
    jpegs = _jpegs(shards)
    assert reduced_flag((48, 64), (24, 32)) == cv2.IMREAD_REDUCED_COLOR_2
    assert reduced_flag((480, 640), (60, 80)) == cv2.IMREAD_REDUCED_COLOR_8
    assert reduced_flag((480, 640), (100, 80)) == cv2.IMREAD_REDUCED_COLOR_4
    assert reduced_flag((48, 64), (30, 40)) == cv2.IMREAD_COLOR
    for size in [(24, 32), (20, 30)]:
        b = next(iter(video_pipe(shards, episodes=["ep0001"], batch_size=2, max_batches=1, resize=size)))
        assert b["front"].shape == (2, 3, *size)
        ref = cv2.imdecode(np.frombuffer(jpegs["ep0001/000001.front.jpg"][1], np.uint8), cv2.IMREAD_REDUCED_COLOR_2)
        ref = cv2.resize(ref, size[::-1], interpolation=cv2.INTER_AREA)[:, :, ::-1].transpose(2, 0, 1)
        np.testing.assert_array_equal(b["front"][1].numpy(), ref)


def _corrupt(shards, tmp_path, name):
    copy = shutil.copytree(shards, tmp_path / "s")
    off, _ = _jpegs(copy)[name]
    with open(copy / "shard-000000.tar", "r+b") as f:
        f.seek(off)
        f.write(b"\0" * 16)  # no JPEG start marker: cv2.imdecode returns None
    index = json.loads((as_v1(copy) / "index.json").read_text())  # v1: crc32 lists in the JSON
    for e in index["episodes"]:  # an index from before per-frame CRCs: the JPEG itself must be caught
        for seg in e["segments"]:
            seg.pop("crc32", None)
    (copy / "index.json").write_text(json.dumps(index))
    return copy


@pytest.mark.parametrize("method", ["thread", "process"])
def test_corrupt_jpeg_is_skipped_counted_and_named(shards, tmp_path, method, caplog):
    copy = _corrupt(shards, tmp_path, "ep0002/000004.wrist.jpg")
    pipe = video_pipe(copy, episodes=["ep0002"], batch_size=4, max_batches=10, method=method)
    with caplog.at_level(logging.WARNING):
        batches = list(pipe)
    assert len(batches) == len(pipe) == 3
    valid = [v for b in batches for v in b["valid"].tolist()]
    assert valid == [True] * 4 + [False] + [True] * 5
    assert pipe.stats["frames_corrupt"] == 1 and pipe.stats["frames_decoded"] == 19
    assert "shard-000000.tar" in caplog.text and "frame 4" in caplog.text and "ep0002" in caplog.text
    assert "1 corrupt frame(s) skipped this pass" in caplog.text and "wrist" in caplog.text


def test_corrupt_jpeg_raises_by_option(shards, tmp_path):
    copy = _corrupt(shards, tmp_path, "ep0002/000004.front.jpg")
    pipe = video_pipe(copy, episodes=["ep0002"], batch_size=4, max_batches=10, on_corrupt="raise", method="process")
    before = set(threading.enumerate()) | set(multiprocessing.active_children())
    with pytest.raises(ValueError, match=r"shard-000000.tar episode 'ep0002' frame 4"):
        list(pipe)
    assert not (set(threading.enumerate()) | set(multiprocessing.active_children())) - before  # released


def test_bad_options_are_refused_by_name(shards):
    with pytest.raises(ValueError, match="method='fork'"):
        video_pipe(shards, episodes=["ep0000"], batch_size=2, max_batches=1, method="fork")
    with pytest.raises(ValueError, match="on_corrupt='ignore'"):
        metric_pipe(shards, frames_per_episode=2, batch_size=2, on_corrupt="ignore")
    with pytest.raises(ValueError, match="split='test'"):
        metric_pipe(shards, split="test", frames_per_episode=2, batch_size=2)


def test_processes_write_into_shared_batch_rows_that_are_reused(shards):
    jpegs = _jpegs(shards)
    pipe = video_pipe(shards, episodes=["ep0000", "ep0001", "ep0002"], batch_size=2, max_batches=100,
                      method="process")
    ptrs = []
    for b in pipe:  # batches let go: the ring of shared slabs is reused
        ptrs.append(b["front"].data_ptr())
        for i, (e, f) in enumerate(zip(b["episode"], b["frame"].tolist())):
            np.testing.assert_array_equal(b["wrist"][i].numpy(), _rgb(jpegs[f"{e}/{f:06d}.wrist.jpg"][1]))
    assert len(ptrs) == 15 and len(set(ptrs)) < 10
