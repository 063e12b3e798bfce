"""TrainReader reads local shards a frame per pread: the same bytes as the source's read, and its errors."""

import os

import pytest
from helpers import make_shards

from episodepipes.pipes import EpisodeIndex
from episodepipes.pipes._decode.mapped import ShardFrames
from episodepipes.shardio import LocalSource, ShardMissingError, ShardTruncatedError


def test_frames_read_are_the_shards_bytes(tmp_path):
    idx = EpisodeIndex.open(make_shards(tmp_path / "s", num_episodes=2, length=6, height=16, width=16))
    src = LocalSource(idx.root)
    mapped = ShardFrames(src)
    name = idx.shards[0].name
    for ep in idx.episodes:
        for t in range(ep.length):
            shard, a, b = ep.frame_range(t)
            got = mapped.read(idx.shards[shard].name, a, b - a)
            assert isinstance(got, memoryview) and bytes(got) == src.read(idx.shards[shard].name, a, b - a)
    assert bytes(mapped.frame(name, 0, 512)) == src.read(name, 0, 512)


def test_a_range_past_the_end_or_a_missing_shard_is_the_sources_error(tmp_path):
    idx = EpisodeIndex.open(make_shards(tmp_path / "s", num_episodes=2, length=6, height=16, width=16))
    name = idx.shards[0].name
    size = os.path.getsize(idx.shard_path(0))
    mapped = ShardFrames(LocalSource(idx.root))
    with pytest.raises(ShardTruncatedError, match=name):
        mapped.read(name, size - 10, 20)
    with pytest.raises(ShardMissingError, match="nope.tar"):
        mapped.read("nope.tar", 0, 1)
    with pytest.raises(ValueError, match="plain base name"):
        ShardFrames(LocalSource(idx.root)).read("../x.tar", 0, 1)


def test_the_reader_leaves_crc_checks_to_the_decode_worker_which_refuses_a_mismatch(tmp_path):
    import dataclasses

    from episodepipes.pipes.decode import portable
    from episodepipes.pipes.sample_decode import EpisodeSpec, SampleDecode
    from episodepipes.pipes.train import TrainReader

    idx = EpisodeIndex.open(make_shards(tmp_path / "s", num_episodes=2, length=6, height=16, width=16))
    reader = TrainReader(idx, idx.split("train"), windows={}, seed=0, rank=0, world_size=1, batch_size=2, epochs=1)
    reader.reset(None)
    raw = next(reader)
    ep = idx.episode(raw.item.episode)
    (step, data, crc), = raw.checks  # the whole current frame, not checked by the reader
    assert step == raw.item.frame and crc == ep.frame_crc(step) and len(data) == ep.frame_range(step)[2] - \
        ep.frame_range(step)[1]
    spec = EpisodeSpec.of(ep)
    assert SampleDecode()(raw, spec).damaged is None
    bad = dataclasses.replace(raw, checks=((step, data, crc ^ 1),))
    out = SampleDecode()(bad, spec)
    assert out.damaged == f"frame {step} does not match its crc32 in the index"
    assert sorted(out.corrupt) == sorted(spec.cameras) and not out.fields["front"].any()
    sent = portable(bad)  # a process worker gets bytes, and the check made before it is sent
    assert sent.checks == () and sent.damaged == out.damaged
    assert all(isinstance(v, bytes) for v in sent.members.values())
