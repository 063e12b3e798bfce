"""The local byte source: plain names only, exact reads, named errors, handles released by close()."""

from __future__ import annotations

import threading

import pytest

from episodepipes.shardio import LocalSource, ShardIOError, check_name, open_source


@pytest.mark.parametrize("name", ["../x.tar", "/etc/passwd", "a/b.tar", "pipe:cat x", ".hidden", "-rf", "", "..",
                                  "s3://b/k", "x\0y", 3])
def test_names_that_leave_the_root_or_carry_a_scheme_are_refused(name):
    with pytest.raises(ValueError, match="plain base name"):
        check_name(name)


def test_reads_exact_ranges_and_names_a_short_file(tmp_path):
    (tmp_path / "shard-000000.tar").write_bytes(bytes(range(256)) * 4)
    src = open_source(tmp_path)
    assert src.size("shard-000000.tar") == 1024
    assert src.read("shard-000000.tar", 250, 10) == bytes(range(250, 256)) + bytes(range(4))
    assert src.read_ranges("shard-000000.tar", [(0, 2), (1022, 2)]) == [b"\0\1", b"\xfe\xff"]
    with pytest.raises(ShardIOError, match=r"shard-000000.tar ends at byte 1024, the index expects 1030"):
        src.read("shard-000000.tar", 1020, 10)
    with pytest.raises(ShardIOError, match=r"shard-000001.tar is missing"):
        src.read("shard-000001.tar", 0, 1)


def test_threads_share_one_descriptor_and_close_releases_it(tmp_path):
    (tmp_path / "a.tar").write_bytes(b"x" * 4096)
    src = LocalSource(tmp_path)
    out: list[bytes] = []
    ts = [threading.Thread(target=lambda: out.append(src.read("a.tar", 0, 4096))) for _ in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert out == [b"x" * 4096] * 8 and len(src._fds) == 1
    src.close()
    assert src._fds == {}
    assert src.read_file("a.tar") == b"x" * 4096  # reopened on demand


def test_a_url_root_is_not_taken_for_a_folder(tmp_path):
    from episodepipes.remote import RemoteSource

    for root in ("s3://bucket/prefix", "gs://bucket/prefix", "https://host/prefix", "http://127.0.0.1:9/x"):
        assert type(open_source(root)) is RemoteSource and open_source(root).root == root
    with pytest.raises(ValueError, match="expected s3://bucket/prefix"):
        open_source("pipe://cat")
    assert open_source(f"file://{tmp_path}").root == str(tmp_path)
