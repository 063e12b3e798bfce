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


def test_members_reads_the_wanted_members_as_a_parse_of_the_whole_frame_finds_them(tmp_path):
    from episodepipes.format import sample_key
    from episodepipes.pipes._decode.mapped import HEAD, frame_members

    idx = EpisodeIndex.open(make_shards(tmp_path / "s", num_episodes=2, length=5, height=96, width=96))
    src = LocalSource(idx.root)
    frames = ShardFrames(src)
    for ep in idx.episodes:
        for t in range(ep.length):
            shard, a, b = ep.frame_range(t)
            name, prefix = idx.shards[shard].name, sample_key(ep.id, t).encode() + b"."
            whole = src.read(name, a, b - a)
            assert len(whole) > 2 * HEAD  # the walk crosses reads: state.npy lies past the JPEGs before it
            for want in ({"action.npy"}, {"state.npy"}, {"action.npy", "keypoints.npy", "state.npy"}):
                got, n = frames.members(name, a, b, prefix, want)
                spans, m = frame_members(memoryview(whole), prefix, want)
                assert set(got) == want and n == m
                for f, (at, body) in got.items():
                    assert at == a + spans[f][0] and bytes(body) == whole[spans[f][0]:spans[f][1]]
            assert frames.members(name, a, b, prefix, {"nope.npy"}) is None  # frame_fields then names what is wrong
            assert frames.members(name, a, b, b"other/000000.", {"action.npy"}) is None


def test_a_window_pass_over_a_shard_cut_short_names_it(tmp_path):
    from episodepipes.pipes.order.window import plan_windows
    from episodepipes.pipes.train import TrainReader

    idx = EpisodeIndex.open(make_shards(tmp_path / "s", num_episodes=2, length=12, height=16, width=16,
                                        shard_size=1 << 30))
    windows = plan_windows(None, {"action": 6}, cameras={"front", "wrist"}, arrays={"state", "action"})
    reader = TrainReader(idx, idx.split("train"), windows=windows, seed=0, rank=0, world_size=1, batch_size=2,
                         epochs=1)
    reader.reset(None)
    assert len(next(reader).windows["action"].steps) == 6
    os.truncate(idx.shard_path(0), 1024)  # what cp over it or rsync --inplace does mid-pass
    with pytest.raises(ShardTruncatedError, match=idx.shards[0].name):
        list(reader)


def test_an_arena_is_reused_once_no_slice_of_it_is_held_and_never_while_one_is(tmp_path):
    from episodepipes.pipes._decode.mapped import ARENA

    idx = EpisodeIndex.open(make_shards(tmp_path / "s", num_episodes=2, length=20, height=64, width=64))
    src = LocalSource(idx.root)
    frames = ShardFrames(src, lease=False)  # preads into arenas (what a reader does where a lease is refused)
    ranges = [(idx.shards[s].name, a, b) for ep in idx.episodes for s, a, b in map(ep.frame_range, range(ep.length))]
    kept = [(r, frames.frame(*r)) for r in ranges[:5]]  # held through everything below
    arenas = {id(kept[0][1].obj)}
    for _ in range(4 * ARENA // sum(b - a for _, a, b in ranges) + 2):  # several arenas' worth, each slice dropped
        for r in ranges:
            view = frames.frame(*r)
            arenas.add(id(view.obj))  # the arena's ndarray (an id, not a reference: holding it would pin it)
            assert bytes(view) == src.read(r[0], r[1], r[2] - r[1])
    assert all(bytes(v) == src.read(n, a, b - a) for (n, a, b), v in kept)  # never overwritten while held
    # the held arena, and the current one and a spare taking turns; a new MiB each time without reuse (the ids of
    # freed arrays can repeat, so this counts the arrays alive at the end as well)
    assert len(arenas) <= 3 and len([frames._arena, *frames._spare]) <= 3


def test_members_of_a_frame_are_read_once_and_whole_frames_still_find_a_shard_cut_short(tmp_path):
    from episodepipes.format import sample_key

    idx = EpisodeIndex.open(make_shards(tmp_path / "s", num_episodes=1, length=4, height=32, width=32,
                                        shard_size=1 << 30))
    frames = ShardFrames(LocalSource(idx.root))
    ep, name = idx.episodes[0], idx.shards[0].name
    _, a, b = ep.frame_range(3)
    prefix = sample_key(ep.id, 3).encode() + b"."
    first = frames.members(name, a, b, prefix, {"action.npy"})
    os.truncate(idx.shard_path(0), a)  # the frame is gone: a read of it now comes back short
    assert frames.members(name, a, b, prefix, {"action.npy"}) == first  # kept, not read again
    with pytest.raises(ShardTruncatedError, match=name):
        frames.members(name, a, b, prefix, {"state.npy"})  # a field not kept is read
    with pytest.raises(ShardTruncatedError, match=name):
        frames.frame(name, a, b)
