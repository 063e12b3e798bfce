"""The index's writing path: its files become visible together, index.json last, and the statistics are
encoded once per state."""

from __future__ import annotations

import pytest

from episodepipes.format import COLUMNS, INDEX_NAME
from episodepipes.index import EpisodeIndex
from episodepipes.normstats.fields import StatsFields, episode_part
from episodepipes.normstats.sidefile import NAME as STATS_NAME
from episodepipes.safefile import UnsafePathError
from episodepipes.safefile import write_files as atomic_write_files
from episodepipes.sharding.formats.synthetic import SyntheticReader
from episodepipes.sharding.write import WriteOptions, write_shards
from episodepipes.sharding.write.writer import write_index

SYN = SyntheticReader(num_episodes=3, length=6, height=16, width=16)


def test_no_index_file_takes_its_name_until_every_one_is_written(tmp_path):
    """A failure writing any file (here index.json's temp name is taken) leaves none of the new files under its
    final name: a column renamed early would sit beside an older index or none."""
    write_shards(SYN, tmp_path / "src", WriteOptions(format="synthetic", shard_size=10**6))
    data = EpisodeIndex.open(tmp_path / "src").data
    shards, episodes = data["shards"], data["episodes"]
    out = tmp_path / "out"
    out.mkdir()
    (out / (INDEX_NAME + ".tmp")).mkdir()
    with pytest.raises(UnsafePathError, match="is a folder"):
        write_index(out, shards, episodes, data["options"])
    assert sorted(p.name for p in out.iterdir() if not p.name.endswith(".tmp")) == []


def test_atomic_write_files_renames_only_after_all_are_written(tmp_path):
    (tmp_path / "c.tmp").mkdir()  # the third file cannot be opened
    with pytest.raises(UnsafePathError, match="is a folder"):
        atomic_write_files([(tmp_path / "a", b"1"), (tmp_path / "b", b"2"), (tmp_path / "c", b"3")])
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    atomic_write_files([(tmp_path / "a", b"1"), (tmp_path / "b", b"2")])
    assert (tmp_path / "a").read_bytes() == b"1" and (tmp_path / "b").read_bytes() == b"2"
    assert not list(tmp_path.glob("[ab].tmp"))


def test_statistics_are_encoded_once_until_more_are_folded_in(tmp_path):
    fields = StatsFields()
    ep = SYN.read("ep0000")
    fields.add(ep.split, *episode_part(ep.id, ep.arrays))
    first = fields.encode()
    assert fields.encode() is first
    fields.add(ep.split, *episode_part(ep.id, ep.arrays))
    again = fields.encode()
    assert again is not first and again != first
    write_shards(SYN, tmp_path / "w", WriteOptions(format="synthetic", shard_size=10**6))
    assert (tmp_path / "w" / STATS_NAME).exists() and all((tmp_path / "w" / f).exists()
                                                         for f, _, _ in (COLUMNS[k] for k in ("episodes", "offset")))
