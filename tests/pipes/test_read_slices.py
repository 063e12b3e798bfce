"""`ShardReader.send_slices`: a video or metric pipe's decode processes read the frames themselves (references, not
bytes), and their batches are the threads' batches."""

from __future__ import annotations

import dataclasses
import pickle

import numpy as np
import pytest
from helpers import make_shards

from episodepipes.pipes import EpisodeIndex, Item, ShardReader, metric_pipe, video_pipe
from episodepipes.pipes._decode.mapped import ShardSlice, resolve
from episodepipes.pipes.decode import portable
from episodepipes.pipes.sample_decode import EpisodeSpec, SampleDecode


@pytest.fixture(scope="module")
def idx(tmp_path_factory):
    return EpisodeIndex.open(make_shards(tmp_path_factory.mktemp("rs") / "s", num_episodes=3, length=7, height=16,
                                         width=24, shard_size=4096))


def _items(idx):
    return [Item(e.id, t) for e in idx.episodes for t in range(e.length)]


def test_a_reader_asked_for_slices_hands_out_references_to_the_bytes_it_would_hand_out(idx):
    views, refs = ShardReader(idx, _items(idx)), ShardReader(idx, _items(idx))
    refs.send_slices()
    views.reset(None)
    refs.reset(None)
    n = 0
    for a, b in zip(views, refs, strict=True):
        assert all(type(v) is ShardSlice for v in [*b.members.values(), *(c[1] for c in b.checks)])
        sent = portable(b)
        wire = pickle.dumps(sent)
        assert b"episodepipes" not in wire  # plain tuples: no frame bytes, no class to reduce
        assert len(wire) < 400
        got = pickle.loads(wire)
        spec = EpisodeSpec.of(idx.episode(a.item.episode))
        x, y = SampleDecode()(a, spec), SampleDecode()(got, spec)
        assert x.damaged is y.damaged is None and x.corrupt == y.corrupt == [] and y.frames == 2
        for k, v in x.fields.items():
            assert np.array_equal(v, y.fields[k]) if isinstance(v, np.ndarray) else v == y.fields[k], k
        assert {k: bytes(resolve(v)) for k, v in b.members.items()} == {k: bytes(v) for k, v in a.members.items()}
        n += 1
    assert n == sum(e.length for e in idx.episodes)


def test_a_reference_whose_frame_fails_its_crc32_is_found_out_in_the_worker(idx):
    r = ShardReader(idx, _items(idx))
    r.send_slices()
    r.reset(None)
    raw = next(r)
    (step, ref, crc), = raw.checks
    bad = portable(dataclasses.replace(raw, checks=((step, ref, crc ^ 1),)))
    out = SampleDecode()(pickle.loads(pickle.dumps(bad)), EpisodeSpec.of(idx.episode(raw.item.episode)))
    assert out.damaged == f"frame {step} does not match its crc32 in the index" and not out.fields["front"].any()
    r.close()


def _batches(pipe):
    return [{k: v.numpy() if hasattr(v, "numpy") else v for k, v in b.items()} for b in pipe]


def _same(x, y):
    assert len(x) == len(y) > 0
    for a, b in zip(x, y, strict=True):
        assert a.keys() == b.keys()
        for k in a:
            assert np.array_equal(a[k], b[k]) if isinstance(a[k], np.ndarray) else a[k] == b[k], k


@pytest.mark.parametrize("windows", [{}, {"history": {"front": 2}, "horizon": {"state": 3}}])
def test_video_and_metric_pipes_give_the_same_batches_on_processes_as_on_threads(idx, windows):
    def video(method):
        return _batches(video_pipe(idx, episodes=[e.id for e in idx.episodes], batch_size=4, max_batches=100,
                                    num_workers=2, method=method, **windows))

    def metric(method):
        return _batches(metric_pipe(idx, split="train", frames_per_episode=5, batch_size=3, num_workers=2,
                                    method=method, **windows))

    _same(video("thread"), video("process"))
    _same(metric("thread"), metric("process"))
