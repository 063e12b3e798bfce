"""The video member a packed frame is handed on as (`videoframes.Gop`): views of the records read, not a copy of
the GOP's packets per frame, and the same frames however it travels (in a thread, pickled to a process)."""

from __future__ import annotations

import pickle

import av
import numpy as np

from episodepipes.codec.pack import unpack
from episodepipes.index import EpisodeIndex
from episodepipes.pipes.videoframes import Gop, VideoFrames, packed_members, parse_packed, video_cameras
from episodepipes.sharding.formats.synthetic import SyntheticReader
from episodepipes.sharding.write.encode import EncodeOptions, encode_episode
from episodepipes.sharding.write.writer import ShardWriter

GOP = 8


def _index(tmp_path):
    reader = SyntheticReader(num_episodes=1, height=32, width=48, lengths=(20,), cameras=("front",))
    with ShardWriter(tmp_path / "s", shard_size=1 << 20, options={}) as w:
        w.add(encode_episode(reader.read("ep0000"), EncodeOptions(codec="h264", gop=GOP)))
    return EpisodeIndex.open(tmp_path / "s")


def _members(ix, frame):
    ep = ix.episode("ep0000")
    shard, a, b = ep.frame_range(0)
    data = memoryview((ix.root / ix.shards[shard].name).read_bytes())
    records = {}
    for f in range(ep.length):
        _, a, b = ep.frame_range(f)
        records[f] = parse_packed(ix, "ep0000", f, data[a:b])
    members, why = packed_members(ix, "ep0000", frame, records.__getitem__)
    assert why is None
    return data, members


def _plain(ix, frame):
    """Frame ``frame`` by a plain PyAV decode of the shard's packets from its keyframe (rgb24, as [3, H, W])."""
    _, members = _members(ix, frame)
    ctx = av.CodecContext.create("h264", "r")
    got = [f.to_ndarray(format="rgb24") for p in [*members["front.h264"].packets, None]
           for f in ctx.decode(None if p is None else av.Packet(bytes(p)))]
    return got[-1].transpose(2, 0, 1)


def test_a_packed_frame_hands_on_its_gop_as_views_of_the_records_read(tmp_path):
    ix = _index(tmp_path)
    data, members = _members(ix, 13)
    gop = members["front.h264"]
    assert isinstance(gop, Gop) and len(gop.packets) == 13 % GOP + 1
    assert all(isinstance(p, memoryview) and p.obj is data.obj for p in gop.packets)  # no copy of the packets
    blobs = unpack(bytes(gop))  # what the members layout stores for the same frame
    assert bytes(blobs[0]) == gop.gid and [bytes(p) for p in blobs[2:]] == [bytes(p) for p in gop.packets]


def test_a_gop_member_decodes_alike_in_a_thread_and_pickled_to_a_process(tmp_path):
    ix = _index(tmp_path)
    _, members = _members(ix, 13)
    frames = VideoFrames(video_cameras(ix))
    want = _plain(ix, 13)
    for member in (members["front.h264"], pickle.loads(pickle.dumps(members["front.h264"])),
                   bytes(members["front.h264"])):
        got = frames.decode("front", member, src=(32, 48))
        assert got is not None and np.array_equal(got, want)
