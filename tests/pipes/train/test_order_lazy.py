"""The block order and the frame table are evaluated lazily: the same order as materialised tables of the blocks
give, and a train_pipe build whose memory does not grow with the frames."""

from __future__ import annotations

import hashlib
import json
import tracemalloc

import numpy as np
import pytest
from helpers import make_shards
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.scale_order import synthetic_index
from episodepipes.index import EpisodeIndex
from episodepipes.pipes import train_pipe
from episodepipes.pipes.chosen import Chosen, choose
from episodepipes.pipes.order import shuffle as frame_table
from episodepipes.pipes.order.block_order import BlockLayout, block_bounds, run_bounds
from episodepipes.pipes.order.permute import IndexShuffle
from episodepipes.pipes.order.shuffle import FrameTable

_BLOCKS, _WINDOW = (1 << 31) + 1, (1 << 31) + 2


def _materialised(bounds, m, seed, epoch):
    """The block order as tables of every block (what the order was before it was lazy): frame of each position."""
    nb, sizes = len(bounds) - 1, np.diff(bounds)
    slots = IndexShuffle.of(nb, seed=seed, epoch=epoch, stream=(_BLOCKS,))(np.arange(nb))
    at = np.concatenate([[0], np.cumsum(sizes[slots])])
    win = np.concatenate([at[:-1:m], [bounds[-1]]])
    out = []
    for w in range(len(win) - 1):
        shuffle = IndexShuffle.of(int(win[w + 1] - win[w]), seed=seed, epoch=epoch, stream=(_WINDOW, w))
        for r in win[w] + shuffle(np.arange(win[w + 1] - win[w])):
            k = np.searchsorted(at, r, side="right") - 1
            out.append(int(bounds[slots[k]] + r - at[k]))
    return out


@settings(max_examples=60, deadline=None)
@given(runs=st.lists(st.integers(1, 40), min_size=1, max_size=10), b=st.integers(1, 9), m=st.integers(1, 4),
       seed=st.integers(0, 2**32), epoch=st.integers(0, 3))
def test_the_lazy_block_order_is_the_materialised_one_and_a_bijection(runs, b, m, seed, epoch):
    shards = np.repeat(np.arange(len(runs)), runs)
    bounds = block_bounds(shards, b)
    layout = BlockLayout.of_runs(run_bounds(shards), block_frames=b, window_blocks=m)
    assert layout.bounds.tolist() == bounds.tolist()
    assert layout.fingerprint == BlockLayout(bounds, block_frames=b, window_blocks=m).fingerprint
    order = layout.order(seed=seed, epoch=epoch)
    got = order(np.arange(len(shards))).tolist()
    assert got == _materialised(bounds, m, seed, epoch)
    assert sorted(got) == list(range(len(shards)))
    blocks = layout.block_of(np.arange(len(shards)))
    assert (layout.block_start(blocks) <= np.arange(len(shards))).all()
    assert (np.arange(len(shards)) < layout.block_end(blocks)).all()


def test_block_bounds_longer_than_block_frames_are_refused():
    with pytest.raises(ValueError, match="at most block_frames=2"):
        BlockLayout(np.array([0, 3]), block_frames=2, window_blocks=1)
    with pytest.raises(ValueError, match="run bounds"):
        BlockLayout.of_runs(np.array([0, 3, 3]), block_frames=2, window_blocks=1)


@given(ids=st.lists(st.text(max_size=4), max_size=9), data=st.data())
def test_the_frame_tables_fingerprint_is_that_of_its_json_chunk_by_chunk(ids, data):
    lengths = data.draw(st.lists(st.integers(0, 10**6), min_size=len(ids), max_size=len(ids)))
    old, frame_table._CHUNK = frame_table._CHUNK, 2
    try:
        got = FrameTable(ids, lengths).fingerprint()
    finally:
        frame_table._CHUNK = old
    assert got == hashlib.sha256(json.dumps([ids, lengths]).encode()).hexdigest()[:16]


class _Column(list):
    """Ids with the id column's ``raw`` (what `chosen`'s ids give): the fingerprint reads them from it at once."""

    def raw(self, a, b):
        return np.array([i.encode() for i in self[a:b]], f"S{max([len(i) for i in self] + [1])}")


@given(ids=st.lists(st.text(st.characters(max_codepoint=127, exclude_characters="\0"), max_size=4), max_size=9),
       data=st.data())
def test_the_fingerprint_read_from_an_id_column_is_that_of_its_json(ids, data):
    """Quotes, backslashes and control characters (json escapes them) included: those chunks go through json."""
    lengths = data.draw(st.lists(st.integers(0, 10**6), min_size=len(ids), max_size=len(ids)))
    old, frame_table._CHUNK = frame_table._CHUNK, 3
    try:
        got = FrameTable(_Column(ids), lengths).fingerprint()
    finally:
        frame_table._CHUNK = old
    assert got == hashlib.sha256(json.dumps([ids, lengths]).encode()).hexdigest()[:16]


def test_a_chosen_episodes_fingerprint_makes_no_str_per_id(tmp_path, monkeypatch):
    """At 10**6 episodes a `str` per id took seconds of the train build: the ids are read from the mapped id column
    a chunk at a time, the digest the same as over the ids listed."""
    from episodepipes.index import idcols

    root = synthetic_index(tmp_path / "d", episodes=5_000, frames=20_000)
    idx = EpisodeIndex.open(root)
    want = {}
    for name, numbers in (("all", np.arange(5_000)), ("some", np.arange(0, 5_000, 7))):
        chosen = Chosen(idx, numbers)
        want[name] = FrameTable([idx.ids[n] for n in numbers.tolist()], chosen.lengths).fingerprint()
    made = []
    monkeypatch.setattr(idcols, "id_text", lambda ids, n: made.append(n) or "")
    for name, numbers in (("all", np.arange(5_000)), ("some", np.arange(0, 5_000, 7))):
        chosen = Chosen(idx, numbers)
        assert FrameTable(chosen.ids, chosen.lengths).fingerprint() == want[name], name
    assert made == []


def test_the_runs_of_chosen_episodes_are_where_their_frames_change_shard(tmp_path):
    root = make_shards(tmp_path / "d", shard_size=1 << 18, num_episodes=7, length=9, height=24, width=32)
    idx = EpisodeIndex.open(root)
    for numbers in ([0, 1, 2, 3, 4, 5, 6], [1, 3, 4], [6], [5, 0]):
        chosen = Chosen(idx, np.array(numbers))
        rows = np.concatenate([np.arange(e.rows.start, e.rows.stop) for e in chosen])
        shards = idx.frame_ranges(rows)[0]
        bounds, of = chosen.runs()
        assert bounds.tolist() == run_bounds(shards).tolist() and of.tolist() == shards[bounds[:-1]].tolist()
        assert chosen.lengths.tolist() == [e.length for e in chosen] and list(chosen.ids) == [e.id for e in chosen]
    assert choose(idx, "train").numbers.tolist() == idx.split_numbers("train").tolist()


def _build_peak(root, shuffle):
    idx = EpisodeIndex.open(root)
    tracemalloc.start()
    try:
        pipe = train_pipe(idx, batch_size=8, seed=0, rank=1, world_size=4, shuffle=shuffle)
        return tracemalloc.get_traced_memory()[1], pipe
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("shuffle", ["full", "block"])
def test_a_train_build_allocates_nothing_per_frame(tmp_path, shuffle):
    peaks = {}
    for frames in (10**6, 10**7):  # the same 10^4 episodes, ten times the frames
        root = synthetic_index(tmp_path / str(frames), episodes=10**4, frames=frames)
        peaks[frames], pipe = _build_peak(root, shuffle)
        assert len(pipe.reader.table) == frames
    # O(episodes + runs): a few int64 per episode; 10^7 frames materialised would be 80 MB and more
    assert peaks[10**7] < 4_000_000 and peaks[10**7] - peaks[10**6] < 200_000, peaks
