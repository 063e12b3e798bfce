"""The reader's in-place member parse (`frame_members`) and the `ShardSlice` references decode processes resolve."""

from __future__ import annotations

import dataclasses
import pickle

import numpy as np
import pytest
from helpers import make_shards

from episodepipes.format import sample_key
from episodepipes.pipes import EpisodeIndex, train_pipe
from episodepipes.pipes._decode.mapped import ShardFrames, ShardSlice, frame_members, resolve
from episodepipes.pipes.decode import portable
from episodepipes.pipes.order.window import plan_windows
from episodepipes.pipes.sample_decode import EpisodeSpec, SampleDecode
from episodepipes.pipes.train import TrainReader
from episodepipes.shardio import LocalSource
from episodepipes.tarmembers import frame_fields


@pytest.fixture(scope="module")
def idx(tmp_path_factory):
    return EpisodeIndex.open(make_shards(tmp_path_factory.mktemp("slices") / "s", num_episodes=3, length=6,
                                         height=16, width=16))


def _frame(idx, ep, t):
    shard, a, b = ep.frame_range(t)
    name = idx.shards[shard].name
    return ShardFrames(LocalSource(idx.root)).frame(name, a, b), name, a, b


@pytest.mark.parametrize("want", [None, {"state.npy"}, {"front.jpg", "action.npy"}])
def test_frame_members_are_the_fields_and_byte_count_of_frame_fields(idx, want):
    src = LocalSource(idx.root)
    for ep in idx.episodes:
        for t in range(ep.length):
            view, name, a, b = _frame(idx, ep, t)
            spans, n = frame_members(view, sample_key(ep.id, t).encode() + b".", want)
            fields, m = frame_fields(lambda size, off, name=name: src.read(name, off, size), a, b, ep.id, t, want)
            assert {f: bytes(view[x:y]) for f, (x, y) in spans.items()} == fields and n == m


def test_frame_members_leave_anything_but_plain_members_of_the_frame_to_frame_fields(idx):
    ep = idx.episodes[0]
    view, *_ = _frame(idx, ep, 1)
    assert frame_members(view, sample_key(ep.id, 2).encode() + b".") is None  # another frame's members
    assert frame_members(view[:600], sample_key(ep.id, 1).encode() + b".") is None  # a member past the range
    assert frame_members(view, sample_key(ep.id, 1).encode() + b".", {"nope.npy"}) is None
    bad = bytearray(view)
    bad[156] = ord("L")  # a GNU long name header
    assert frame_members(memoryview(bytes(bad)), sample_key(ep.id, 1).encode() + b".") is None
    signed = bytearray(view)
    signed[124:136] = b"-0000000001\0"  # a size field int() reads as -1: no tar writes a sign
    key = sample_key(ep.id, 1).encode() + b"."
    first = bytes(view[len(key):100]).split(b"\0", 1)[0].decode()  # the first member's field
    assert frame_members(memoryview(bytes(signed)), key) is None
    assert frame_members(memoryview(bytes(signed)), key, {first}) is None  # found first: no later header to trip
    with pytest.raises(ValueError, match=r"at byte 0 gives member .*negative size \(-1\).*re-shard it"):
        frame_fields(lambda size, off: bytes(signed[off:off + size]), 0, len(signed), ep.id, 1, {first})


def test_a_reader_asked_for_slices_hands_out_references_a_process_resolves_to_the_same_bytes(idx):
    windows = plan_windows({"front": 2}, {"state": 3}, cameras={"front", "wrist"}, arrays={"state"})
    kw = dict(windows=windows, seed=0, rank=0, world_size=1, batch_size=2, epochs=1)
    views, refs = TrainReader(idx, idx.split("train"), **kw), TrainReader(idx, idx.split("train"), **kw)
    refs.send_slices()
    views.reset(None)
    refs.reset(None)
    for a, b in zip(views, refs, strict=True):
        sent = portable(b)
        assert sent is b  # nothing copied, no crc32 made in the parent: the worker checks the frame
        assert all(isinstance(v, ShardSlice) for v in [*b.members.values(), *(c[1] for c in b.checks)])
        got = pickle.loads(pickle.dumps(sent))  # what a worker process gets: a few small tuples
        assert {k: bytes(resolve(v)) for k, v in got.members.items()} == {k: bytes(v) for k, v in a.members.items()}
        for k, w in got.windows.items():
            want = {s: bytes(v) for s, v in a.windows[k].data.items()}
            assert {s: bytes(resolve(v)) for s, v in w.data.items()} == want
        spec = EpisodeSpec.of(idx.episode(a.item.episode))
        x, y = SampleDecode()(a, spec), SampleDecode()(got, spec)
        assert x.damaged is y.damaged is None
        for k, v in x.fields.items():
            assert np.array_equal(v, y.fields[k]) if isinstance(v, np.ndarray) else v == y.fields[k], k


def test_a_reference_whose_frame_fails_its_crc32_is_refused_in_the_worker(idx):
    r = TrainReader(idx, idx.split("train"), windows={}, seed=0, rank=0, world_size=1, batch_size=2, epochs=1)
    r.send_slices()
    r.reset(None)
    raw = next(r)
    (step, ref, crc), = raw.checks
    bad = dataclasses.replace(raw, checks=((step, ref, crc ^ 1),))
    out = SampleDecode()(pickle.loads(pickle.dumps(portable(bad))), EpisodeSpec.of(idx.episode(raw.item.episode)))
    assert out.damaged == f"frame {step} does not match its crc32 in the index" and not out.fields["front"].any()


def test_process_and_thread_pipes_give_the_same_batches(idx):
    def batches(method):
        return [{k: v.numpy() if hasattr(v, "numpy") else v for k, v in b.items()}
                for b in train_pipe(idx, batch_size=2, seed=3, method=method, history={"front": 2})]

    for x, y in zip(batches("thread"), batches("process"), strict=True):
        assert x.keys() == y.keys()
        for k in x:
            assert np.array_equal(x[k], y[k]) if isinstance(x[k], np.ndarray) else x[k] == y[k], k


def test_a_process_result_comes_back_as_tuples_and_bytes_and_unpacks_to_writable_arrays(idx):
    from episodepipes.pipes._decode import slabs as _slabs
    from episodepipes.pipes.decode import decode_shared, unpack_shared

    r = TrainReader(idx, idx.split("train"), windows={}, seed=0, rank=0, world_size=1, batch_size=2, epochs=1)
    r.send_slices()
    r.reset(None)
    raw = next(r)
    spec = EpisodeSpec.of(idx.episode(raw.item.episode))
    slabs = _slabs.Slabs(2)
    slabs.share({c: (3, *hw) for c, hw in spec.cameras.items()}, 1)
    rows, addr = slabs.next_rows({c: (3, *hw) for c, hw in spec.cameras.items()})
    packed = decode_shared(SampleDecode(), raw, spec, addr)
    assert isinstance(packed, tuple) and not any(isinstance(v, np.ndarray) for v in packed[3].values())
    got = unpack_shared(pickle.loads(pickle.dumps(packed)))
    want = SampleDecode()(raw, spec)
    assert got.corrupt == want.corrupt == [] and got.frames == want.frames == 2 and got.damaged is None
    assert set(got.fields) == set(want.fields) - set(spec.cameras)  # the frames are in the shared rows
    for k, v in got.fields.items():
        if isinstance(v, np.ndarray):
            assert v.flags.writeable and v.dtype == want.fields[k].dtype and np.array_equal(v, want.fields[k]), k
        else:
            assert v == want.fields[k], k
    for c in spec.cameras:
        assert np.array_equal(rows[c], want.fields[c])


def test_a_sample_without_windows_borrows_nothing_and_is_sent_as_it_is(idx):
    from episodepipes.pipes._decode.batchmemo import BatchMemo

    r = TrainReader(idx, idx.split("train"), windows={}, seed=0, rank=0, world_size=1, batch_size=2, epochs=1)
    r.reset(None)
    raw = next(r)
    memo = BatchMemo(2)
    cams = sorted(idx.episode(raw.item.episode).cameras)
    assert memo.plan(raw, cams) is raw
    again = memo.plan(raw, cams)  # the same frame twice in a batch (a mixture's source starting over)
    assert again is raw and again.borrowed == frozenset()  # decoded again, not borrowed: nothing to copy in


def test_a_sample_of_references_into_one_shard_travels_as_plain_tuples_and_decodes_the_same(idx):
    r = TrainReader(idx, idx.split("train"), windows={}, seed=0, rank=0, world_size=1, batch_size=2, epochs=1)
    r.send_slices()
    r.reset(None)
    for raw in r:
        sent = portable(raw)
        wire = pickle.dumps(sent)
        assert b"episodepipes" not in wire  # no class to reduce: str, int and tuples only
        spec = EpisodeSpec.of(idx.episode(raw.item.episode))
        got, want = SampleDecode()(pickle.loads(wire), spec), SampleDecode()(raw, spec)
        assert got.damaged is want.damaged is None and got.corrupt == want.corrupt == [] and got.frames == 2
        assert got.fields.keys() == want.fields.keys()
        for k, v in want.fields.items():
            assert np.array_equal(v, got.fields[k]) if isinstance(v, np.ndarray) else v == got.fields[k], k
    (step, ref, crc), = raw.checks
    bad = pickle.loads(pickle.dumps(portable(dataclasses.replace(raw, checks=((step, ref, crc ^ 1),)))))
    out = SampleDecode()(bad, EpisodeSpec.of(idx.episode(raw.item.episode)))
    assert out.damaged == f"frame {step} does not match its crc32 in the index"  # still checked in the worker
    assert not out.fields["front"].any() and out.fields["episode"] == raw.item.episode


def test_only_plain_samples_of_one_shards_references_go_as_tuples(idx):
    from episodepipes.pipes._decode.mapped import to_wire

    r = TrainReader(idx, idx.split("train"), windows={}, seed=0, rank=0, world_size=1, batch_size=2, epochs=1)
    r.send_slices()
    r.reset(None)
    raw = next(r)
    assert to_wire(raw) is not None
    other = ShardSlice(raw.members["front.jpg"].path + "x", 0, 1)
    assert to_wire(dataclasses.replace(raw, members={**raw.members, "front.jpg": other})) is None
    assert to_wire(dataclasses.replace(raw, damaged="crc32 mismatch")) is None
    assert to_wire(dataclasses.replace(raw, borrowed=frozenset({"front"}))) is None
    assert to_wire(dataclasses.replace(raw, members={**raw.members, "front.jpg": b"bytes"})) is None
