"""episodepipes.index is split into modules (indexopen, indexrecords, indexepisodes, indexstats, indexv1, filebytes),
and what callers saw of it stays: every name they import, and the public path its types are named, pickled and
documented by."""

import pickle

import numpy as np
from helpers import make_shards

import episodepipes.index as index_module
from episodepipes.index import EpisodeIndex


def test_every_name_callers_import_from_the_index_module_is_still_there():
    for name in [*index_module.__all__, "mapped"]:
        assert getattr(index_module, name).__name__ == name


def test_the_index_types_keep_their_public_path_in_pickles_and_reprs(tmp_path):
    idx = EpisodeIndex.open(make_shards(tmp_path / "s", num_episodes=2, length=4, height=16, width=24))
    ep = idx.episodes[0]
    records = [next(iter(ep.cameras.values())), next(iter(ep.arrays.values())), ep.segments[0], idx.shards[0]]
    for obj in records:
        assert type(obj).__module__ == "episodepipes.index"
        raw = pickle.dumps(obj)
        assert b"episodepipes.index" in raw and pickle.loads(raw) == obj
    assert type(ep).__module__ == "episodepipes.index" and repr(ep).startswith("Episode(id='ep0000'")
    again = pickle.loads(pickle.dumps(idx))  # a v2 index pickles as a re-open of its file
    assert again.episodes[1] == idx.episodes[1] and np.array_equal(again.lengths, idx.lengths)
