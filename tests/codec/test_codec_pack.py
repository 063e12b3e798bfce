import io
import struct
import tarfile

import numpy as np
import pytest

from episodepipes.codec import Packets, gop_chunks, pack, pack_arrays, tar_framing, unpack, unpack_arrays
from episodepipes.codec.pack import entry_ranges, pack_packets


def test_pack_round_trips_and_its_ranges_point_at_each_blob():
    blobs = [b"key" * 100, b"", b"p1", bytes(range(256)) * 3]
    member = pack(blobs)
    assert [bytes(b) for b in unpack(member)] == blobs
    assert [member[o:o + s] for o, s in entry_ranges([len(b) for b in blobs])] == blobs
    assert len(member) == 8 + 4 * len(blobs) + sum(map(len, blobs))  # the table is all the overhead
    assert unpack(pack([])) == []


@pytest.mark.parametrize("damage", [
    lambda m: b"XPK1" + m[4:],
    lambda m: m[:-1],
    lambda m: m + b"\0",
    lambda m: m[:4] + struct.pack("<I", 1 << 30) + m[8:],
    lambda m: m[:8] + struct.pack("<I", 10 ** 6) + m[12:],
    lambda m: m[:6],
])
def test_a_damaged_pack_is_refused_by_name(damage):
    with pytest.raises(ValueError, match="chunk 7"):
        unpack(damage(pack([b"abc", b"defg"])), where="chunk 7")


def test_arrays_pack_per_chunk_and_read_back_exactly():
    arrays = {"state": np.arange(24, dtype=np.float32).reshape(4, 6), "action": np.ones((4, 2), ">f8"),
              "done": np.array([False, False, False, True])}
    back = unpack_arrays(pack_arrays(arrays))
    assert sorted(back) == sorted(arrays)
    for k, a in arrays.items():
        assert back[k].dtype.isnative and back[k].dtype == a.dtype.newbyteorder("=") and np.array_equal(back[k], a)


def test_a_pack_that_is_not_arrays_is_refused():
    with pytest.raises(ValueError, match="array keys"):
        unpack_arrays(pack([b'["a", "b"]', b"x"]))
    with pytest.raises(ValueError, match="does not read"):
        unpack_arrays(pack([b'["a"]', b"not npy"]))
    obj = io.BytesIO()
    np.save(obj, np.array([object()], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="does not read"):
        unpack_arrays(pack([b'["a"]', obj.getvalue()]))  # pickle is never loaded


def test_tar_framing_matches_what_tarfile_writes():
    sizes = [0, 1, 511, 512, 513, 3000]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as t:
        for i, s in enumerate(sizes):
            info = tarfile.TarInfo(f"m{i}")
            info.size = s
            t.addfile(info, io.BytesIO(bytes(s)))
    with tarfile.open(fileobj=io.BytesIO(buf.getvalue())) as t:
        last = t.getmembers()[-1]
    members_end = last.offset_data + -(-last.size // 512) * 512  # where the closing zero blocks begin
    assert tar_framing(sizes) == members_end - sum(sizes)
    assert tar_framing([100] * 10) == 10 * 1024 - 1000  # small members: a header and most of a block each


@pytest.mark.parametrize(("key", "frames", "want"), [
    ([0, 0, 2, 2, 4, 4, 6], 4, [(0, 4), (4, 7)]),
    ([0, 0, 2, 2, 4, 4, 6], 1, [(0, 2), (2, 4), (4, 6), (6, 7)]),
    ([0, 0, 0, 3, 3, 3, 6, 6], 4, [(0, 6), (6, 8)]),
    ([0, 1, 1, 1, 1, 1], 2, [(0, 6)]),  # a GOP longer than the chunk is never split
    ([], 4, []),
])
def test_chunks_hold_whole_gops(key, frames, want):
    assert gop_chunks(np.array(key, np.int64), frames) == want


def test_a_streams_packets_pack_into_chunks_of_whole_gops_with_their_ranges():
    data = [bytes([i]) * (10 + i) for i in range(7)]
    p = Packets("h264", b"", 16, 16, data, np.array([0, 0, 2, 2, 4, 4, 6]), lead=1)
    chunks = pack_packets(p, 3)
    assert [(c.first, len(c.ranges)) for c in chunks] == [(0, 4), (4, 3)]
    for c in chunks:
        assert [c.member[o:o + n] for o, n in c.ranges] == data[c.first:c.first + len(c.ranges)]
        assert [bytes(b) for b in unpack(c.member)] == data[c.first:c.first + len(c.ranges)]

