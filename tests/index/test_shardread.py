"""`episodepipes.index.shardread`: a shard read in chunks gives the sha256 and every range's crc32 that the whole
bytes give, however the chunks cut the ranges; a file shorter than asked is `ShardTruncatedError` naming it."""

from __future__ import annotations

import hashlib
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from episodepipes.errors import ShardTruncatedError
from episodepipes.index import shardread


@given(data=st.binary(max_size=3000), cuts=st.lists(st.integers(0, 3000), max_size=8),
       spans=st.lists(st.tuples(st.integers(0, 3100), st.integers(0, 900)), max_size=20))
def test_digest_over_chunks_equals_the_whole(data, cuts, spans):
    edges = sorted({0, len(data), *(c for c in cuts if c <= len(data))})
    parts = [memoryview(data)[a:b] for a, b in zip(edges, edges[1:])]
    sha, crcs = shardread.digest(parts, spans)
    assert sha == hashlib.sha256(data).hexdigest()
    assert crcs == [zlib.crc32(data[a:a + n]) for a, n in spans]


def test_chunks_read_a_file_in_order_and_name_it_where_it_is_short(tmp_path, monkeypatch):
    monkeypatch.setattr(shardread, "CHUNK", 7)
    f = tmp_path / "shard-000000.tar"
    f.write_bytes(bytes(range(50)))
    assert b"".join(bytes(c) for c in shardread.chunks(f, 50)) == bytes(range(50))
    with pytest.raises(ShardTruncatedError, match=rf"{f} ends at byte 50, the index expects 60"):
        list(shardread.chunks(f, 60))
    with shardread.ranges(f) as pread:
        assert pread(5, 10) == bytes(range(10, 15))
        with pytest.raises(ShardTruncatedError, match=rf"{f} ends at byte 50, the index expects 55"):
            pread(10, 45)
