"""The single writer checks an episode's packed chunks before it writes a byte of them: a damaged chunk (a record
whose pack table or head lies, a decode that starts before its chunk, sizes that disagree with the bytes) is
refused naming the episode and frame, and nothing of it reaches a shard."""

from __future__ import annotations

import struct

import pytest

from episodepipes.codec.chunk import spans
from episodepipes.sharding.formats.synthetic import SyntheticReader
from episodepipes.sharding.write.encode import EncodeOptions, encode_episode
from episodepipes.sharding.write.writer import ShardWriter

SYN = SyntheticReader(num_episodes=1, height=32, width=48, lengths=(150,), cameras=("front", "wrist"))


@pytest.fixture(scope="module")
def episode():
    enc = encode_episode(SYN.read("ep0000"), EncodeOptions(codec="h264", gop=4))
    return enc.meta, enc.data(), enc.sizes


def _record(data: bytes, t: int) -> int:
    """The byte at which frame ``t``'s record starts."""
    sp = spans(data, where="test")
    return sum(sp.spans[:t]) + sp.heads[t]


def _refused(tmp_path, meta, data, sizes, match):
    out = tmp_path / "out"
    w = ShardWriter(out, shard_size=1 << 20, options={})
    with pytest.raises(ValueError, match=match):
        w.add_frames(meta, data, sizes)
    assert not list(out.glob("*")) if out.exists() else True  # no shard, not even a .tmp one


def test_the_encoders_chunks_pass_and_give_every_frames_place(episode, tmp_path):
    meta, data, sizes = episode
    sp = spans(data, where="test")
    assert sp.spans == sizes and sum(sp.ends) == 3 and sp.ends[-1]  # 150 frames: chunks of 64, 64 and 22
    assert sp.keys == [t // 4 * 4 for t in range(150)]
    with ShardWriter(tmp_path / "ok", shard_size=1 << 20, options={}) as w:
        entry = w.add_frames(meta, data, sizes)
    assert [s["count"] for s in entry["segments"]] == [150]


def test_a_record_without_its_magic_is_refused(episode, tmp_path):
    meta, data, sizes = episode
    bad = bytearray(data)
    at = _record(data, 70)
    bad[at:at + 4] = b"XXXX"
    _refused(tmp_path, meta, bytes(bad), sizes, r"episode 'ep0000' frame 70: not a packed member")


def test_a_record_whose_table_lies_is_refused(episode, tmp_path):
    meta, data, sizes = episode
    bad = bytearray(data)
    at = _record(data, 5)
    (n,) = struct.unpack_from("<I", bad, at + 4)
    struct.pack_into("<I", bad, at + 8 + 4 * (n - 1), struct.unpack_from("<I", bad, at + 8 + 4 * (n - 1))[0] - 1)
    _refused(tmp_path, meta, bytes(bad), sizes, r"episode 'ep0000' frame 5: its offset table does not match")


def test_a_decode_that_starts_before_its_chunk_is_refused(episode, tmp_path):
    meta, data, sizes = episode
    bad = bytearray(data)
    at = _record(data, 64)  # the second chunk's first frame, a keyframe: back 0
    (n,) = struct.unpack_from("<I", bad, at + 4)
    struct.pack_into("<H", bad, at + 8 + 4 * n + 4, 1)  # the second camera's back: one frame before the chunk
    _refused(tmp_path, meta, bytes(bad), sizes, r"episode 'ep0000' frame 64: its decode starts before its chunk")


def test_a_chunk_cut_short_or_sizes_that_disagree_are_refused(episode, tmp_path):
    meta, data, sizes = episode
    _refused(tmp_path, meta, data[:-600], sizes[:-1], r"episode 'ep0000'.*(starts no packed chunk|no tar header)")
    _refused(tmp_path, meta, data, [*sizes[:-2], sizes[-2] + 1, sizes[-1] - 1],
             r"episode 'ep0000': its frame sizes do not match its packed chunks")
