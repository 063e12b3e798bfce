"""Workers and files live for one pass: `shutdown()`, and an abandoned iterator, release them."""

from __future__ import annotations

import gc
import multiprocessing
import threading

import numpy as np
import pytest

from episodepipes import _forkserver
from episodepipes.pipes import video_pipe
from episodepipes.pipes._decode import pool as _pool


@pytest.fixture(scope="module")
def shards(shard_folder):
    return shard_folder("life", num_episodes=2, length=12, height=32, width=48)


def _workers() -> set:
    return {t for t in threading.enumerate() if t.name.startswith(_pool.THREAD_PREFIX)} | set(
        multiprocessing.active_children())


def _pipe(shards, method):
    return video_pipe(shards, episodes=["ep0000", "ep0001"], batch_size=2, max_batches=12, method=method)


@pytest.mark.parametrize("method", ["thread", "process"])
def test_a_pass_abandoned_with_break_releases_its_workers(shards, method):
    pipe = _pipe(shards, method)
    it = iter(pipe)
    for _ in it:
        assert _workers()  # running while the pass is
        break
    del it
    gc.collect()
    assert not _workers()
    assert len(list(pipe)) == len(pipe) == 12  # the next pass is whole


@pytest.mark.parametrize("method", ["thread", "process"])
def test_shutdown_releases_workers_and_the_state_resumes_where_it_stopped(shards, method):
    pipe = _pipe(shards, method)
    it = iter(pipe)
    first = [next(it)["frame"].tolist() for _ in range(3)]
    state = pipe.state_dict()
    pipe.shutdown()
    assert not _workers() and list(it) == []  # a shut-down pass is over
    pipe.load_state_dict(state)
    rest = [b["frame"].tolist() for b in pipe]
    whole = [b["frame"].tolist() for b in _pipe(shards, "thread")]
    assert first + rest == whole


def test_an_old_iterator_collected_later_leaves_the_new_pass_alone(shards):
    pipe = _pipe(shards, "thread")
    old = iter(pipe)
    next(old)
    new = iter(pipe)
    next(new)
    del old
    gc.collect()
    assert len(list(new)) == 11


@pytest.mark.parametrize("start", ["spawn", "forkserver"])
def test_processes_without_fork_decode_the_same_frames(shards, monkeypatch, start):
    monkeypatch.setattr(_forkserver, "start_method", lambda: start)
    ref = [b["front"].numpy().copy() for b in _pipe(shards, "thread")]
    pipe = _pipe(shards, "process")
    got = [b["front"].numpy().copy() for b in pipe]
    assert len(got) == len(ref) == 12 and pipe.stats["frames_decoded"] == 48
    for a, b in zip(got, ref):
        np.testing.assert_array_equal(a, b)
    assert not _workers()
