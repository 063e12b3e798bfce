import multiprocessing
import threading

import pytest

from episodepipes.pipes import EpisodeIndex, Gate, video_pipe


@pytest.fixture(scope="module")
def shards(shard_folder):
    return shard_folder("gate", num_episodes=4, length=12, height=48, width=64, shard_size=40_000)


def _workers():
    """The live threads and child processes (sets, so one ending from an earlier test does not count)."""
    return set(threading.enumerate()) | set(multiprocessing.active_children())


def _none_new(before):
    return not (_workers() - before)


def _nothing_happened(pipe):
    s = pipe.stats
    return s["bytes_read"] == 0 and s["frames_decoded"] == 0 and s["workers_started"] == 0 and s["open_passes"] == 0


@pytest.mark.parametrize("method", ["thread", "process"])
def test_closed_gate_reads_decodes_and_starts_nothing(shards, method):
    before = _workers()
    pipe = video_pipe(shards, episodes=["ep0000", "ep0001"], batch_size=4, max_batches=5,
                      gate=lambda: False, method=method)
    assert len(pipe) == 5
    it = iter(pipe)  # Lightning's throwaway iterator: never read
    assert _none_new(before) and _nothing_happened(pipe) and pipe.stats["closed_passes"] == 0
    del it
    for _ in range(3):
        assert list(pipe) == []
    assert _none_new(before) and _nothing_happened(pipe)
    assert pipe.stats["closed_passes"] == 3


@pytest.mark.parametrize("method", ["thread", "process"])
def test_open_pass_after_closed_ones_works_and_releases_its_workers(shards, method):
    before = _workers()
    state = {"open": False}
    pipe = video_pipe(shards, episodes=["ep0001"], batch_size=5, max_batches=10, method=method)
    pipe.gate.bind(lambda: state["open"])
    assert list(pipe) == []
    state["open"] = True
    batches = list(pipe)
    assert [len(b["frame"]) for b in batches] == [5, 5, 2] and len(pipe) == 3
    assert [f for b in batches for f in b["frame"].tolist()] == list(range(12))
    assert _none_new(before)
    assert pipe.stats["open_passes"] == 1 and pipe.stats["closed_passes"] == 1
    assert pipe.stats["workers_started"] == 2 and pipe.stats["frames_decoded"] == 24
    state["open"] = False
    assert list(pipe) == [] and pipe.stats["frames_decoded"] == 24


def test_workers_are_gone_once_the_last_batch_is_returned(shards):
    before = _workers()
    pipe = video_pipe(shards, episodes=["ep0002"], batch_size=4, max_batches=3)
    it = iter(pipe)
    for _ in range(3):
        next(it)  # a consumer that stops at len() and never sees StopIteration
    assert _none_new(before)


def test_early_close_releases_workers(shards):
    before = _workers()
    pipe = video_pipe(shards, episodes=["ep0002", "ep0003"], batch_size=2, max_batches=10, method="process")
    it = iter(pipe)  # held: an iterator dropped at once would end its pass itself
    next(it)
    assert not _none_new(before)
    pipe.close()
    assert _none_new(before)


def test_gate_decides_at_first_next_not_at_reset(shards):
    calls = []
    pipe = video_pipe(shards, episodes=["ep0000"], batch_size=4, max_batches=1, gate=lambda: calls.append(1) or True)
    it = iter(pipe)
    assert calls == []
    next(it)
    assert calls == [1]


def test_gate_around_a_custom_upstream_builds_only_when_open():
    from torchdata.nodes import IterableWrapper

    built = []

    def build():
        built.append(1)
        return IterableWrapper(range(3))

    gate = Gate(build, lambda: False)
    gate.reset()
    assert list(gate) == [] and built == []
    gate.bind(None)  # no predicate: open
    gate.reset()
    assert list(gate) == [0, 1, 2] and built == [1]


def test_uncapped_video_pipe_is_refused_with_the_timeout_reason(shards):
    with pytest.raises(ValueError, match="process-group timeout"):
        video_pipe(shards, episodes=["ep0000"], batch_size=4, max_batches=None)


def test_unknown_episode_lists_close_matches(shards):
    with pytest.raises(KeyError, match="ep0001"):
        video_pipe(EpisodeIndex.open(shards), episodes=["ep001"], batch_size=4, max_batches=2)
