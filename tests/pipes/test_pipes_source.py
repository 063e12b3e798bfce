"""Every shard read of the pipes and of merge goes through one byte source, which owns the handles and the errors."""

from __future__ import annotations

import os
import shutil

import pytest
from helpers import make_shards

from episodepipes.pipes import EpisodeIndex, ShardReader, train_pipe
from episodepipes.pipes.plan import Item
from episodepipes.shardio import LocalSource, ShardMissingError, ShardTruncatedError

SHAPE = dict(num_episodes=3, length=6, height=16, width=24, shard_size=20_000)


class Counting(LocalSource):
    """A local source that records what it is asked for: proves the reader goes through it."""

    def __init__(self, root: object) -> None:
        super().__init__(root)  # type: ignore[arg-type]
        self.reads: list[tuple[str, int, int]] = []

    def read(self, name: str, offset: int, size: int) -> bytes:
        self.reads.append((name, offset, size))
        return super().read(name, offset, size)


def _fds(folder) -> int:
    """Descriptors of this process open on shards under ``folder`` (other tests' threads may open and close
    descriptors of their own meanwhile, and the index keeps its mapped columns open)."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
            n += target.startswith(str(folder)) and target.endswith(".tar")
        except OSError:  # closed between listdir and readlink
            pass
    return n


def test_shard_reader_reads_one_range_per_run_through_the_source_it_is_given(tmp_path):
    index = EpisodeIndex.open(make_shards(tmp_path / "s", **SHAPE))
    copy = shutil.copytree(tmp_path / "s", tmp_path / "copy")
    for s in index.shards:
        (tmp_path / "s" / s.name).unlink()  # only the source's folder has the shards now
    items = [Item("ep0001", f) for f in (0, 1, 2, 4)] + [Item("ep0002", 5)]
    src = Counting(copy)
    got = [(r.item, sorted(r.members)) for r in ShardReader(index, items, source=src)]
    assert [i for i, _ in got] == items and all("front.jpg" in m for _, m in got)

    def run(episode, first, last):  # one read of a run of adjacent frames
        shard, start, _ = index.episode(episode).frame_range(first)
        return index.shards[shard].name, start, index.episode(episode).frame_range(last)[2] - start

    assert src.reads == [run("ep0001", 0, 2), run("ep0001", 4, 4), run("ep0002", 5, 5)]
    assert src._fds, "a source passed in is the caller's: the reader leaves it open"
    src.close()


def test_a_reader_closes_its_own_source_at_the_end_of_a_pass(tmp_path):
    index = EpisodeIndex.open(make_shards(tmp_path / "s", **SHAPE))
    reader = ShardReader(index, [Item("ep0000", f) for f in range(6)])
    reader.reset()
    first = next(reader)
    assert 1 <= _fds(tmp_path) <= 3  # the source's descriptor; the shard's leased mapping's own and its mmap's
    rest = list(reader)
    assert len(rest) == 5
    del first, rest  # the samples' members are slices of the mapping: it (and its descriptors) live while they do
    assert _fds(tmp_path) == 0


def test_train_pipe_names_a_missing_and_a_truncated_shard(tmp_path):
    out = make_shards(tmp_path / "s", **SHAPE)
    index = EpisodeIndex.open(out)
    first = out / index.shards[0].name
    kw = dict(batch_size=2, seed=0, rank=0, world_size=1, num_workers=1)
    data = first.read_bytes()
    first.write_bytes(data[:len(data) // 3])
    with pytest.raises(ShardTruncatedError, match=rf"{index.shards[0].name} ends at byte \d+, the index expects"):
        list(train_pipe(out, **kw))
    first.unlink()
    with pytest.raises(ShardMissingError, match=rf"{index.shards[0].name} is missing; restore it or re-shard"):
        list(train_pipe(out, **kw))
    assert issubclass(ShardMissingError, FileNotFoundError) and issubclass(ShardTruncatedError, ValueError)
