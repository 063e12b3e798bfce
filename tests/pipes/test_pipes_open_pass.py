"""The open (render) pass of video_pipe: samples go to the decode workers in chunks, frames stay exact."""

import tarfile

import cv2
import numpy as np
import pytest

from episodepipes.pipes import video_pipe
from episodepipes.pipes._decode import pool as _pool


@pytest.fixture(scope="module")
def shards(shard_folder):
    return shard_folder("open", num_episodes=3, length=10, height=48, width=64, shard_size=1 << 22)


def _jpegs(shards):
    with tarfile.open(shards / "shard-000000.tar") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar if m.name.endswith(".jpg")}


def _rgb(data):
    return cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)[:, :, ::-1].transpose(2, 0, 1)


def _counting(monkeypatch):
    tasks = []
    submit = _pool.Pool.submit

    def counted(self, fn, *args):
        tasks.append(fn)
        return submit(self, fn, *args)

    monkeypatch.setattr(_pool.Pool, "submit", counted)
    return tasks


@pytest.mark.parametrize("method", ["thread", "process"])
def test_an_open_pass_sends_samples_in_chunks_and_keeps_frames_and_order(shards, method, monkeypatch):
    tasks = _counting(monkeypatch)
    jpegs = _jpegs(shards)
    pipe = video_pipe(shards, episodes=["ep0002", "ep0000", "ep0001"], batch_size=8, max_batches=100, method=method)
    for _ in range(2):  # the second pass reuses the pipe's batch buffers, chunked alike
        tasks.clear()
        seen = []
        for b in pipe:
            for i, (e, f) in enumerate(zip(b["episode"], b["frame"].tolist())):
                seen.append((e, f))
                for cam in ("front", "wrist"):
                    np.testing.assert_array_equal(b[cam][i].numpy(), _rgb(jpegs[f"{e}/{f:06d}.{cam}.jpg"]))
        assert seen == [(e, f) for e in ("ep0002", "ep0000", "ep0001") for f in range(10)]
        assert 0 < len(tasks) <= len(seen) // 2, len(tasks)  # a task per sample was 30 tasks


def test_a_transform_still_gets_a_task_per_sample(shards, monkeypatch):
    tasks = _counting(monkeypatch)
    pipe = video_pipe(shards, episodes=["ep0000"], batch_size=2, max_batches=100, transform=lambda s: s)
    assert sum(len(b["frame"]) for b in pipe) == 10 and len(tasks) == 10


def test_processes_writing_into_the_shared_ring_take_a_batch_per_task(shards, monkeypatch):
    """The ring is sized for the rows in flight, and each process task costs the parent its executor's wake-ups:
    30 samples in batches of 8 go as 4 tasks (threads, whose buffers are the pipe's few slabs, send 2 a task)."""
    assert _pool.shares_memory()  # Linux has a fork server: the frames go through the shared ring
    tasks = _counting(monkeypatch)
    pipe = video_pipe(shards, episodes=["ep0002", "ep0000", "ep0001"], batch_size=8, max_batches=100,
                      method="process")
    for _ in range(2):
        tasks.clear()
        assert sum(len(b["frame"]) for b in pipe) == 30
        assert len(tasks) == 4, len(tasks)
