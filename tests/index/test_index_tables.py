"""`EpisodeIndex.tables`: the one value the code around the index reads its tables through (issue 24).

It must stay a view (a v2 index's mapped columns, never copies: nothing per frame at open) and travel with the
index wherever the index goes (a v1 index pickles whole, to spawned workers)."""

import pickle

import numpy as np
import pytest
from helpers import as_v1, make_shards

from episodepipes.format import COLUMNS
from episodepipes.index import EpisodeIndex, IndexFormatError, Tables
from episodepipes.index.v2 import COUNT, FIRST, LENGTH, ROW, SEGMENT, SHARD


@pytest.fixture
def shards(tmp_path):
    return make_shards(tmp_path / "s", num_episodes=3, length=5, height=16, width=24, shard_size=1 << 14)


def test_the_tables_are_the_index_columns_not_copies(shards):
    ix = EpisodeIndex.open(shards)
    t = ix.tables
    assert isinstance(t, Tables) and ix.tables is t
    for name, arr in (("episodes", t.episodes), ("segments", t.segments), ("offset", t.offset), ("size", t.size),
                      ("crc32", t.crc)):
        assert arr is t.columns[name] and not arr.flags.owndata, name  # mapped, shared by every process
    assert t.episodes[:, LENGTH].tolist() == [5, 5, 5] and ix.lengths is not None
    with pytest.raises(AttributeError):
        t.offset = np.zeros(1)  # frozen: the index's tables are not replaced from outside


def test_episode_segments_match_the_episodes(shards):
    ix = EpisodeIndex.open(shards)
    for e in ix.episodes:
        got = ix.tables.episode_segments(e.number)
        assert got == tuple((s.shard, s.first, s.count) for s in e.segments)
        assert int(ix.tables.episodes[e.number, FIRST]) == e.rows.start
    assert len(ix.tables.segments) > len(ix.episodes)  # the small shard_size splits episodes across shards


def test_check_segments_names_the_damaged_segment(shards):
    ix = EpisodeIndex.open(shards)
    ix.tables.check_segments(range(len(ix.tables.segments)))  # intact: no error
    j = int(np.flatnonzero(ix.tables.segments[:, COUNT] >= 2)[-1])  # the last segment of two frames or more
    n = int(np.searchsorted(ix.tables.episodes[:, SEGMENT], j, side="right")) - 1
    row = int(ix.tables.segments[j, ROW])
    off = np.load(shards / COLUMNS["offset"][0])
    off[row + 1] = off[row]  # two of its frames at one byte
    np.save(shards / COLUMNS["offset"][0], off)
    damaged = EpisodeIndex.open(shards)  # v2 checks a segment's frames on first use, not at open
    damaged.tables.check_segments(range(j))
    which = f"episode {ix.ids[n]!r} segment {j - int(ix.tables.episodes[n, SEGMENT])}"
    with pytest.raises(IndexFormatError, match=rf"index.json is damaged: {which}: .*re-shard"):
        damaged.tables.check_segments([j])


def test_a_v1_index_pickles_with_its_tables(shards):
    ix = EpisodeIndex.open(as_v1(shards))
    assert ix.version == 1
    again = pickle.loads(pickle.dumps(ix))
    for name in ("episodes", "segments", "offset", "size"):
        assert np.array_equal(getattr(again.tables, name), getattr(ix.tables, name)), name
    assert again.episodes[2] == ix.episodes[2] and again.tables.splits == ix.tables.splits
    assert int(again.tables.segments[0, SHARD]) == 0 and int(again.tables.episodes[0, SEGMENT]) == 0
