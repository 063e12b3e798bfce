"""Hostile remote surroundings: a range cache folder another user can write (or owns, or links from), read through
a real S3 server (moto), whose planted entry must never come back as a shard's bytes; a server whose ranged answer's
body is not the range asked for."""

from __future__ import annotations

import os
import re
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from remotecases import upload_synthetic
from s3server import Served

from episodepipes.index import EpisodeIndex
from episodepipes.remote import RangeCache, RemoteOptions, RemoteSource
from episodepipes.shardio import ShardIOError, open_source

BUCKET, PREFIX = "hostile", "v1"
URL = f"s3://{BUCKET}/{PREFIX}"
OTHER_UID = 54321  # a user that is not this one (the tests run as root, which may chown to it)


# its own, not `shard_folder`: uploaded to moto by `remotecases.upload_synthetic` (the remote suites' one)
@pytest.fixture(scope="module")
def shards(moto, tmp_path_factory) -> Path:
    return upload_synthetic(moto, tmp_path_factory.mktemp("hostile-remote") / "shards", BUCKET, PREFIX)


def _frame(shards: Path) -> tuple[str, int, int]:
    index = EpisodeIndex.open(shards)
    shard, a, b = index.episodes[0].frame_range(3)
    return index.shards[shard].name, a, b - a


def _sha(shards: Path, name: str) -> str:
    return next(s.sha256 for s in EpisodeIndex.open(shards).shards if s.name == name)


def _plant(folder: Path, name: str, sha: str, off: int, n: int) -> bytes:
    """An entry for that range of the shard the index vouches for, as another user would leave it: the right
    size, other bytes."""
    fake = b"\x5a" * n
    folder.mkdir(exist_ok=True)
    RangeCache(folder, 1 << 30)._path(URL, name, f"sha256:{sha}", off, n).write_bytes(fake)
    return fake


def _others_can_write(folder: Path) -> None:
    folder.chmod(0o777)


def _others_own(folder: Path) -> None:
    os.chown(folder, OTHER_UID, OTHER_UID)


@pytest.mark.parametrize("make", [_others_can_write, _others_own], ids=["world-writable", "another user's"])
def test_a_cache_dir_another_user_can_fill_is_refused_not_read(shards, proxy, tmp_path, make):
    name, off, n = _frame(shards)
    folder = tmp_path / "shared-cache"
    fake = _plant(folder, name, _sha(shards, name), off, n)
    make(folder)
    src = RemoteSource(URL, RemoteOptions(cache_dir=folder, backoff=0.001))
    src.pin({name: _sha(shards, name)})  # as EpisodeIndex.open does: the planted entry is the one it would read
    try:
        with pytest.raises(ValueError) as e:  # it returned the planted bytes as the frame's
            src.read(name, off, n)
    finally:
        src.close()
    msg = str(e.value)
    assert "cache_dir=" in msg and str(folder) in msg and "\n" not in msg
    assert proxy.gets() == []  # refused before any request, and before any entry is read
    assert open_source(shards).read(name, off, n) != fake


def test_a_cache_dir_that_is_another_users_link_is_refused(shards, proxy, tmp_path):
    """A link planted (in a shared /tmp, say) where the cache folder will be, pointing at a folder of ours: following
    it would write entries there, and evict (delete) its *.bin files past the bound."""
    name, off, n = _frame(shards)
    ours = tmp_path / "ours"
    ours.mkdir(mode=0o700)
    (ours / "keep.bin").write_bytes(b"x" * 10_000)
    link = tmp_path / "cache"
    link.symlink_to(ours)
    os.lchown(link, OTHER_UID, OTHER_UID)
    src = RemoteSource(URL, RemoteOptions(cache_dir=link, cache_bytes=1000, backoff=0.001))
    try:
        with pytest.raises(ValueError) as e:
            src.read(name, off, n)
    finally:
        src.close()
    assert "cache_dir=" in str(e.value) and str(link) in str(e.value) and "\n" not in str(e.value)
    assert [p.name for p in ours.iterdir()] == ["keep.bin"]


def test_a_private_cache_dir_still_serves_and_is_made_private(shards, proxy, tmp_path):
    name, off, n = _frame(shards)
    folder = tmp_path / "new" / "cache"
    want = open_source(shards).read(name, off, n)
    for _ in range(2):
        with RemoteSource(URL, RemoteOptions(cache_dir=folder, backoff=0.001)) as src:
            assert src.read(name, off, n) == want
    assert len(proxy.gets()) == 1  # the second source read the entry the first stored
    assert folder.stat().st_mode & 0o077 == 0


class _Answering(BaseHTTPRequestHandler):
    """The hostile test servers' quiet handler: `answer` sends a status, headers and a body (none to a HEAD)."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def answer(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command == "GET":
            self.wfile.write(body)


class _BodyServer(Served):
    """A real HTTP server on 127.0.0.1 that answers a ranged GET 206 with the right Content-Range but a body
    ``extra`` bytes longer (or, negative, shorter) than that range: a broken server or proxy in between."""

    def __init__(self, data: bytes, extra: int) -> None:
        class Handler(_Answering):
            def do_GET(self) -> None:
                m = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range") or "")
                if not m:
                    return self.answer(200, data)
                a, b = int(m.group(1)), int(m.group(2)) + 1
                self.answer(206, data[a:b + extra], {"Content-Range": f"bytes {a}-{b - 1}/{len(data)}"})

            do_HEAD = do_GET

        self._serve(Handler)


@pytest.mark.parametrize("extra", [-5, 50], ids=["short body", "long body"])
def test_a_ranged_get_whose_body_is_not_the_range_is_refused_by_name(extra):
    data = bytes(range(256)) * 40
    server = _BodyServer(data, extra)
    try:
        with RemoteSource(f"{server.endpoint}/root", RemoteOptions(attempts=1, gap=0, waste=None)) as src:
            with pytest.raises(ShardIOError) as e:  # short: "ends at byte 10240, the index expects 1020: truncated?"
                src.read_many([("shard-000000.tar", [(1000, 20), (3000, 10)])])  # long: accepted
    finally:
        server.close()
    msg = str(e.value)
    assert f"{server.endpoint}/root/shard-000000.tar" in msg and "\n" not in msg
    assert f"sent {20 + extra} bytes" in msg and "truncated" not in msg


class _ErrorServer(Served):
    """A real HTTP server on 127.0.0.1 answering every request ``status`` with an error body carrying terminal
    control sequences (set the window title, clear the screen) and a right-to-left override."""

    BODY = b"<Error><Message>\x1b]0;owned\x07\x1b[2Jgone \xe2\x80\xae desrever\rover</Message></Error>"

    def __init__(self, status: int) -> None:
        body = self.BODY

        class Handler(_Answering):
            def do_GET(self) -> None:
                self.answer(status, body)

            do_HEAD = do_GET

        self._serve(Handler)


@pytest.mark.parametrize("status", [403, 500])
def test_a_server_error_body_reaches_messages_without_its_control_characters(status, capsys):
    from episodepipes.sharding.cli import main

    server = _ErrorServer(status)
    try:
        with RemoteSource(f"{server.endpoint}/root", RemoteOptions(attempts=1)) as src:
            with pytest.raises(ShardIOError) as e:
                src.read("shard-000000.tar", 0, 20)
        capsys.readouterr()
        code = main(["info", f"{server.endpoint}/root"])
    finally:
        server.close()
    err = capsys.readouterr().err
    msg = str(e.value)  # it carried ESC, BEL, CR and U+202E as sent
    assert all(c.isprintable() for c in msg) and "\\x1b]0;owned\\x07" in msg and "\\u202e" in msg, repr(msg)
    assert all(c.isprintable() for c in err.rstrip("\n")) and err.count("\n") == 1
    assert code == 2 and "Traceback" not in err
