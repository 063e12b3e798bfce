"""A shard that is no regular file (a FIFO, a device, a folder) is refused by name at its first read, by every pipe
and the mapped reader: a FIFO used to block the open forever, and /dev/zero never ends."""

from __future__ import annotations

import os
import shutil
import threading

import pytest
from helpers import make_shards, put_dev_zero, put_fifo, put_folder

from episodepipes.index import EpisodeIndex
from episodepipes.pipes import metric_pipe, train_pipe, video_pipe
from episodepipes.shardio import LocalSource, ShardIOError

WAIT = 30.0  # far above a read of these shards; a regression fails here instead of hanging the suite


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    return make_shards(tmp_path_factory.mktemp("fifo") / "s", num_episodes=2, length=6, height=16, width=16,
                       shard_size=20_000)


@pytest.fixture
def copy(good, tmp_path):
    return shutil.copytree(good, tmp_path / "s")


_fifo, _dev_zero, _folder = put_fifo, put_dev_zero, put_folder


def _within(fn, fifo):
    """``fn()``'s exception (None if it returned), failing after WAIT seconds; a reader left blocked on ``fifo`` is
    released by opening its other end, so the thread ends."""
    out: list[BaseException | None] = []

    def run() -> None:
        try:
            fn()
            out.append(None)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(WAIT)
    if t.is_alive():
        if os.path.exists(fifo):
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail(f"reading a pipe with {fifo} in place of a shard did not end in {WAIT} s")
    return out[0]


PIPES = {
    "metric_pipe": lambda root: list(metric_pipe(root, split="train", frames_per_episode=3, batch_size=2)),
    "video_pipe": lambda root: list(video_pipe(root, episodes=["ep0000", "ep0001"], batch_size=4, max_batches=9)),
    "train_pipe": lambda root: list(train_pipe(root, batch_size=2, seed=0, rank=0, world_size=1)),
}


@pytest.mark.parametrize("pipe", sorted(PIPES))
@pytest.mark.parametrize("make", [_fifo, _dev_zero, _folder])
def test_a_shard_that_is_no_regular_file_is_refused_by_name_by_every_pipe(copy, pipe, make):
    shard = copy / EpisodeIndex.open(copy).shards[0].name
    shard.unlink()
    make(shard)
    err = _within(lambda: PIPES[pipe](copy), shard)
    assert isinstance(err, ShardIOError), err
    msg = str(err)
    assert msg.startswith(f"{shard} is not a regular file") and "re-shard" in msg and "\n" not in msg


def test_the_source_refuses_a_fifo_without_waiting_and_reads_the_other_shards(copy):
    names = [s.name for s in EpisodeIndex.open(copy).shards]
    assert len(names) >= 2
    (copy / names[0]).unlink()
    os.mkfifo(copy / names[0])
    with LocalSource(copy) as src:
        err = _within(lambda: src.size(names[0]), copy / names[0])
        assert isinstance(err, ShardIOError) and str(copy / names[0]) in str(err)
        assert src.read(names[1], 0, 512) == (copy / names[1]).read_bytes()[:512]
