"""The train reader's per-batch work is done for several batches at once, and changes nothing it reads."""

import math

import pytest
from helpers import make_shards

from episodepipes.pipes import EpisodeIndex
from episodepipes.pipes.order.permute import IndexShuffle, rank_positions
from episodepipes.pipes.train import STEPS_AHEAD, TrainReader


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    return EpisodeIndex.open(make_shards(tmp_path_factory.mktemp("hot") / "s", num_episodes=5, length=13, height=8,
                                         width=8))


def _reader(idx, **kw):
    args = dict(windows={}, seed=3, rank=0, world_size=1, batch_size=2, epochs=2)
    return TrainReader(idx, idx.split("train"), **{**args, **kw})


@pytest.mark.parametrize(("rank", "world"), [(0, 1), (1, 3)])
def test_orders_and_byte_ranges_are_looked_up_once_per_steps_ahead_batches_in_the_permutations_order(index, rank,
                                                                                                     world):
    reader = _reader(index, rank=rank, world_size=world)
    lookups = []
    looked_up = index.frame_ranges
    index.frame_ranges = lambda rows, *a: lookups.append(len(rows)) or looked_up(rows, *a)
    try:
        reader.reset(None)
        got = [(s.item.episode, s.item.frame) for s in reader]
    finally:
        del index.frame_ranges
    steps = reader.per_epoch // reader.batch_size
    want = []
    for epoch in range(2):
        order = IndexShuffle.of(len(reader.table), seed=3, epoch=epoch)
        for step in range(steps):
            at = rank_positions(step, rank=rank, world_size=world, batch_size=2)
            want += [(reader.table.ids[e], t) for e, t in map(reader.table.locate, order(at).tolist())]
    assert got == want
    assert len(lookups) == 2 * math.ceil(steps / STEPS_AHEAD) < 2 * steps  # per epoch: one lookup per 8 steps


def test_a_reader_restored_between_cached_steps_continues_exactly(index):
    full = _reader(index)
    full.reset(None)
    items = [s.item for s in full]
    for n in (3, 2 * STEPS_AHEAD + 1, full.per_epoch + 5):  # inside a cached run of steps, and in the next epoch
        first = _reader(index)
        first.reset(None)
        for _ in range(n):
            next(first)
        again = _reader(index)
        again.reset(first.state_dict())
        assert [s.item for s in again] == items[n:]


def test_the_decoder_keeps_the_readers_cursor_and_makes_its_state_only_when_asked(index):
    from episodepipes.pipes.decode import Decoder

    def decoder(state=None):
        reader = _reader(index, epochs=1)
        dec = Decoder(reader, index, num_workers=2, cursor=reader)
        dec.reset(state)
        return dec

    full = [(s["episode"], s["frame"]) for s in decoder()]
    dec = decoder()
    made = []
    reader_state = dec.source.state_at
    dec.source.state_at = lambda cursor: made.append(cursor) or reader_state(cursor)
    got = [next(dec) for _ in range(5)]
    assert made == []  # nothing per sample read
    state = dec.state_dict()
    assert made == [(0, 5, 1)]  # the state before the first sample not handed out, not the reader's own (ahead)
    assert dec.source.state_dict()["pos"] > 5
    assert [(s["episode"], s["frame"]) for s in got] + [(s["episode"], s["frame"]) for s in decoder(state)] == full
    dec.shutdown()  # with samples in flight: the state still resumes at the first one not handed out
    assert dec.state_dict() == state


@pytest.mark.parametrize("slices", [False, True])
def test_a_frame_without_windows_skips_the_window_path_and_reads_the_same_sample(index, slices):
    def samples(general):
        reader = _reader(index, epochs=1)
        if slices:
            reader.send_slices()
        reads = []
        read = reader._read
        reader._read = lambda *a, **k: reads.append(a[1]) or read(*a, **k)
        if general:
            reader._plain_sample = lambda *a: None
        reader.reset(None)
        out = [(s.item, s.shard, {f: bytes(v) if isinstance(v, memoryview) else v for f, v in s.members.items()},
                [(st, bytes(d) if isinstance(d, memoryview) else d, c) for st, d, c in s.checks], s.damaged)
               for s in reader]
        return out, reads

    fast, reads = samples(general=False)
    slow, general_reads = samples(general=True)
    assert fast == slow and reads == [] and len(general_reads) == len(slow)
    assert all(checks for *_, checks, _ in fast)  # each whole frame still goes to the worker's crc32 check
