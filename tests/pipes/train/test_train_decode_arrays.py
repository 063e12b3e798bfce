"""The worker's in-line .npy path and its check for shard references: what it takes, and what it leaves to the
full parse (corrupt members still counted corrupt, references anywhere in a sample still resolved)."""

from __future__ import annotations

import dataclasses
import io
import zlib

import numpy as np
from helpers import make_shards

from episodepipes.format import npy_load
from episodepipes.pipes import EpisodeIndex
from episodepipes.pipes._decode.mapped import ShardSlice
from episodepipes.pipes.sample_decode import EpisodeSpec, SampleDecode
from episodepipes.pipes.train import TrainReader


def _first(tmp_path):  # noqa: ANN001, ANN202
    idx = EpisodeIndex.open(make_shards(tmp_path / "s", num_episodes=1, length=4, height=16, width=16))
    reader = TrainReader(idx, idx.split("train"), windows={}, seed=0, rank=0, world_size=1, batch_size=2, epochs=1)
    reader.reset(None)
    raw = next(reader)
    return idx, raw, EpisodeSpec.of(idx.episode(raw.item.episode))


def test_an_npy_member_is_a_view_of_its_tail_and_a_member_cut_short_or_retyped_is_corrupt(tmp_path):
    idx, raw, spec = _first(tmp_path)
    names = [n for n in raw.members if n.endswith(".npy")]
    assert names
    out = SampleDecode()(raw, spec)
    for n in names:
        assert np.array_equal(out.fields[n[:-4]], npy_load(bytes(raw.members[n])))
        assert np.shares_memory(out.fields[n[:-4]], np.frombuffer(raw.members[n], np.uint8))  # no copy made
    assert out.corrupt == []
    name = names[0]
    key, data = name[:-4], bytes(raw.members[name])
    dtype, shape = spec.arrays[key]
    other = np.zeros(shape, np.dtype(dtype).newbyteorder(">" if np.dtype(dtype).byteorder != ">" else "<"))
    buf = io.BytesIO()
    np.save(buf, other)  # the same shape and size in the other byte order: a header that is not the writer's
    for bad in (data[:-1], buf.getvalue()):
        got = SampleDecode()(dataclasses.replace(raw, members={**raw.members, name: bad}), spec)
        assert got.corrupt == [key] and not got.fields[key].any(), len(bad)


def test_a_shard_reference_only_in_the_checks_or_a_window_is_still_resolved(tmp_path):
    idx, raw, spec = _first(tmp_path)
    ep = idx.episode(raw.item.episode)
    shard, start, end = ep.frame_range(raw.item.frame)
    path = str(idx.shard_path(shard))
    ref = ShardSlice(path, start, end - start)
    plain = {k: bytes(v) for k, v in raw.members.items()}
    crc = zlib.crc32(open(path, "rb").read()[start:end])
    good = dataclasses.replace(raw, members=plain, checks=((raw.item.frame, ref, crc),))
    assert SampleDecode()(good, spec).damaged is None
    bad = dataclasses.replace(good, checks=((raw.item.frame, ref, crc ^ 1),))
    assert SampleDecode()(bad, spec).damaged == f"frame {raw.item.frame} does not match its crc32 in the index"
