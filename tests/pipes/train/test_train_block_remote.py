"""train_pipe(shuffle="block") on S3 (moto): what it yields locally, one ranged GET per block instead of one per
frame, and at most ``depth + 1`` windows of bytes held."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import make_shards

from episodepipes.pipes import EpisodeIndex
from episodepipes.pipes.train import train_pipe

BUCKET = "blocks"
URL = f"s3://{BUCKET}/b"
SHAPE = dict(num_episodes=6, lengths=(12, 7, 5, 9, 11, 4), height=16, width=24)  # train: 39 frames
BLOCK = dict(shuffle="block", block_frames=4, window_blocks=2)


@pytest.fixture(scope="module")
def shards(moto, shard_folder) -> Path:
    out = shard_folder("block-remote", **SHAPE)
    moto.upload_dir(out, BUCKET, "b")
    return out


def _plain(batches) -> list[dict]:
    return [{k: (str(v.dtype), tuple(v.shape), v.numpy().tobytes()) if torch.is_tensor(v) else v
             for k, v in sorted(b.items())} for b in batches]


@pytest.mark.parametrize("windows", [{}, dict(history={"state": 3, "front": 2}, horizon={"action": 4})])
def test_the_block_order_yields_what_it_yields_locally(shards, proxy, windows):
    kw = dict(batch_size=4, seed=3, rank=0, world_size=1, epochs=2, num_workers=2, **BLOCK, **windows)
    local = _plain(train_pipe(shards, **kw))
    assert _plain(train_pipe(URL, **kw)) == local and len(local) == 2 * 9


def test_an_epoch_costs_a_ranged_get_per_block_and_its_own_bytes(shards, proxy):
    index = EpisodeIndex.open(URL)
    kw = dict(batch_size=3, seed=1, rank=0, world_size=1, num_workers=2)
    full = train_pipe(index, **kw)
    proxy.reset()
    list(full)
    per_frame = len(proxy.gets())
    pipe = train_pipe(index, **kw, **BLOCK)
    proxy.reset()
    assert sum(len(b["episode"]) for b in pipe) == 39
    own = sum(b - a for e in index.split("train") for _, a, b in map(e.frame_range, range(e.length)))
    blocks = pipe.reader.blocks.blocks
    assert per_frame >= 30 and len(proxy.gets()) <= blocks < 15  # one GET per block (or fewer: adjacent ones merge)
    assert own <= proxy.body_bytes <= 1.1 * own


def test_the_reader_holds_at_most_depth_plus_one_windows(shards, proxy):
    index = EpisodeIndex.open(URL)
    pipe = train_pipe(index, batch_size=4, seed=2, rank=0, world_size=1, num_workers=1, epochs=2, **BLOCK)
    reader, ahead = pipe.reader, pipe.reader._ahead
    frames = reader.blocks.block_frames * reader.blocks.window_blocks
    assert ahead.depth == 2  # ceil(4 batches of 4 / windows of 8 frames)
    biggest = max(b - a for e in index.split("train") for _, a, b in map(e.frame_range, range(e.length)))
    reader.reset(None)
    peak = 0
    for _ in range(2 * 36):
        reader.next()
        held = {id(d): len(d) for got in ahead.held() for steps in got.values() for d in steps.values()}
        assert len(ahead.held()) <= ahead.depth + 1
        peak = max(peak, sum(held.values()))
    assert 0 < peak <= (ahead.depth + 1) * frames * biggest
    assert peak < sum(b - a for e in index.split("train") for _, a, b in map(e.frame_range, range(e.length)))
    reader.close()


def test_a_remote_block_pipe_resumes_mid_window_as_locally(shards, proxy):
    kw = dict(batch_size=3, seed=4, rank=0, world_size=1, epochs=2, num_workers=1, **BLOCK)
    local = _plain(train_pipe(shards, **kw))
    head = train_pipe(URL, **kw)
    it = iter(head)
    got = _plain([next(it) for _ in range(5)])  # 15 frames: inside the second window of 8
    state = head.state_dict()
    rest = train_pipe(URL, **kw)
    rest.load_state_dict(state)
    assert got + _plain(rest) == local


@pytest.mark.parametrize("method", ["thread", "process"])
def test_a_remote_frame_is_checked_in_the_decode_worker_and_a_damaged_one_is_corrupt(moto, proxy, tmp_path, method):
    from episodepipes.pipes.decode import portable
    from episodepipes.pipes.train import TrainReader
    from episodepipes.tarmembers import frame_fields

    out = make_shards(tmp_path / "s", **SHAPE)
    idx = EpisodeIndex.open(out)
    ep = idx.episodes[1]
    shard, start, end = ep.frame_range(2)
    path = idx.shard_path(shard)
    data = bytearray(path.read_bytes())
    member = frame_fields(lambda n, o: bytes(data[o:o + n]), start, end, ep.id, 2)[0]["front.jpg"]
    data[data.index(member, start) + len(member) // 2] ^= 0x5A  # the JPEG still decodes: only the crc32 tells
    path.write_bytes(bytes(data))
    moto.upload_dir(out, BUCKET, "damaged")
    url = f"s3://{BUCKET}/damaged"
    remote = EpisodeIndex.open(url)
    reader = TrainReader(remote, remote.split("train"), windows={}, seed=0, rank=0, world_size=1, batch_size=3,
                         epochs=1, blocks=(4, 2))
    reader.reset(None)
    raw = reader.next()
    (step, whole, crc), = raw.checks  # the reading thread leaves the check to the worker, as for a local shard
    e = remote.episode(raw.item.episode)
    assert step == raw.item.frame and crc == e.frame_crc(step) and len(whole) == e.frame_range(step)[2] - \
        e.frame_range(step)[1]
    assert portable(raw).checks == ()  # a process worker gets the check made before the bytes are sent
    reader.close()
    kw = dict(batch_size=3, seed=0, rank=0, world_size=1, num_workers=2, method=method, **BLOCK)
    pipe = train_pipe(url, **kw)
    batches = list(pipe)
    assert _plain(batches) == _plain(train_pipe(out, **kw))
    bad = [(e, f) for b in batches for e, f, v in zip(b["episode"], b["frame"].tolist(), b["valid"].tolist()) if not v]
    assert bad == [(ep.id, 2)] and pipe.stats["frames_corrupt"] >= 1


@pytest.mark.parametrize("world_size", [1, 4])
def test_a_window_hands_out_views_of_its_gets_bodies_where_they_are_mostly_this_ranks(shards, proxy, world_size):
    from episodepipes.pipes.train import TrainReader

    index, local = EpisodeIndex.open(URL), EpisodeIndex.open(shards)
    reader = TrainReader(index, index.split("train"), windows={}, seed=5, rank=0, world_size=world_size,
                         batch_size=2, epochs=1, blocks=(4, 2))
    index.frame_ranges(np.arange(index.frames))  # the index's own column blocks fetched now: count shard GETs only
    proxy.reset()
    got = reader._fetch_window((0, 0))
    frames = [(flat, v) for flat, steps in got.items() for v in steps.values()]
    assert frames and len(proxy.gets()) <= 2  # the window's two blocks
    for flat, v in frames:
        e, t = reader.table.locate(flat)
        shard, a, b = local.split("train")[e].frame_range(t)
        assert isinstance(v, memoryview) and v == local.shard_path(shard).read_bytes()[a:b]
    bodies = {id(v.obj) for _, v in frames}
    if world_size == 1:  # every frame of the blocks is this rank's: slices of the (at most two) GET bodies
        assert len(bodies) <= 2 < len(frames) and not any(isinstance(v.obj, bytes) for _, v in frames)
    else:  # a quarter of each block: copies of this rank's frames, so the bodies are not kept
        assert len(bodies) == len(frames) and all(len(v.obj) == len(v) for _, v in frames)
    reader.close()
