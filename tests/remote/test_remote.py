"""The remote byte source against a real S3 server (moto) behind a fault-injecting, byte-counting proxy."""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import threading
import time
from pathlib import Path

import pytest
from remotecases import s3_secrets_absent, upload_synthetic
from s3server import Faults, RangeHTTPServer

from episodepipes.index import EpisodeIndex
from episodepipes.remote import RangeCache, RemoteOptions, RemoteSource
from episodepipes.shardio import ShardIOError, open_source

BUCKET, PREFIX = "episodes", "runs/v1"
FAST = RemoteOptions(backoff=0.001, max_backoff=0.01, timeout=5.0)


# its own, not `shard_folder`: uploaded to moto by `remotecases.upload_synthetic` (the remote suites' one)
@pytest.fixture(scope="module")
def shards(moto, tmp_path_factory) -> Path:
    return upload_synthetic(moto, tmp_path_factory.mktemp("remote") / "shards", BUCKET, PREFIX)


def _frames(index: EpisodeIndex) -> list[tuple[str, int, int]]:
    out = []
    for ep in index.episodes:
        for f in range(ep.length):
            shard, start, end = ep.frame_range(f)
            out.append((index.shards[shard].name, start, end - start))
    return out


def test_every_frame_range_reads_the_local_bytes(shards, proxy):
    index = EpisodeIndex.open(shards)
    assert len(index.shards) > 1
    local, remote = open_source(shards), open_source(f"s3://{BUCKET}/{PREFIX}", options=FAST)
    assert isinstance(remote, RemoteSource)
    for name, off, n in _frames(index):
        assert remote.read(name, off, n) == local.read(name, off, n)
    for s in index.shards:
        assert remote.size(s.name) == s.bytes
        ranges = [(off, n) for name, off, n in _frames(index) if name == s.name]
        assert remote.read_ranges(s.name, ranges) == local.read_ranges(s.name, ranges)
    assert remote.read_file("index.json") == (shards / "index.json").read_bytes()


def test_opening_costs_no_request_and_close_reopens(shards, proxy):
    src = open_source(f"s3://{BUCKET}/{PREFIX}/", options=FAST)
    repr(src), src.close()
    assert proxy.requests == []
    name = EpisodeIndex.open(shards).shards[0].name
    assert src.read(name, 0, 10) == (shards / name).read_bytes()[:10]
    assert len(proxy.requests) == 1
    src.close()
    assert src.read(name, 5, 5) == (shards / name).read_bytes()[5:10]


def test_adjacent_ranges_are_one_get_and_bytes_stay_within_1_1x(shards, proxy):
    index = EpisodeIndex.open(shards)
    src = open_source(f"s3://{BUCKET}/{PREFIX}", options=FAST)
    ep = index.episodes[1]
    by_shard: dict[str, list[tuple[int, int]]] = {}
    for f in range(ep.length):
        shard, start, end = ep.frame_range(f)
        by_shard.setdefault(index.shards[shard].name, []).append((start, end - start))
    name, ranges = max(by_shard.items(), key=lambda kv: len(kv[1]))
    assert len(ranges) > 3
    src.read_ranges(name, ranges)
    assert len(proxy.gets()) == 1  # N adjacent frames, one ranged GET
    proxy.reset()  # a whole pinned episode, across its shards: within 1.1x of its own bytes
    total = 0
    for shard_name, rs in by_shard.items():
        src.read_ranges(shard_name, rs)
        total += sum(n for _, n in rs)
    assert proxy.body_bytes <= 1.1 * total
    proxy.reset()  # ranges with small gaps between them (a header skipped per frame): still one GET, <= 1.1x
    gappy = [(o + 256, n - 512) for o, n in ranges]
    assert src.read_ranges(name, gappy) == [(shards / name).read_bytes()[o:o + n] for o, n in gappy]
    assert len(proxy.gets()) == 1 and proxy.body_bytes <= 1.1 * sum(n for _, n in gappy)
    proxy.reset()  # with no gap allowed, every other frame is a GET of exactly its bytes
    sparse = ranges[::2]
    tight = RemoteSource(f"s3://{BUCKET}/{PREFIX}", RemoteOptions(gap=0, backoff=0.001))
    assert tight.read_ranges(name, sparse) == [(shards / name).read_bytes()[o:o + n] for o, n in sparse]
    assert proxy.body_bytes == sum(n for _, n in sparse) and len(proxy.gets()) == len(sparse)


def test_503s_and_dropped_connections_are_survived(shards, proxy):
    index = EpisodeIndex.open(shards)
    src = open_source(f"s3://{BUCKET}/{PREFIX}", options=RemoteOptions(attempts=10, backoff=0.001, max_request=1))
    frames = _frames(index)
    proxy.reset(Faults(error_rate=0.2, drop_rate=0.15, seed=1))  # one GET per frame (max_request=1)
    for s in index.shards:
        ranges = [(off, n) for name, off, n in frames if name == s.name]
        assert src.read_ranges(s.name, ranges) == [(shards / s.name).read_bytes()[o:o + n] for o, n in ranges]
    assert len(proxy.gets()) > len(frames) + 5  # faults really happened and were retried


def test_gets_overlap_up_to_max_in_flight_and_no_further(shards, proxy):
    name = EpisodeIndex.open(shards).shards[0].name
    src = open_source(f"s3://{BUCKET}/{PREFIX}", options=RemoteOptions(max_in_flight=4, max_request=1))
    ranges = [(i * 1000, 1000) for i in range(24)]
    proxy.reset(Faults(latency=0.05))  # long enough for every GET to overlap with others
    assert src.read_ranges(name, ranges) == [(shards / name).read_bytes()[o:o + n] for o, n in ranges]
    assert len(proxy.gets()) == 24 and proxy.peak == 4


def test_a_timeout_is_retried_then_named(shards, proxy):
    name = EpisodeIndex.open(shards).shards[0].name
    src = open_source(f"s3://{BUCKET}/{PREFIX}", options=RemoteOptions(attempts=2, backoff=0.001, timeout=0.2))
    proxy.reset(Faults(latency=0.4))
    with pytest.raises(ShardIOError, match=rf"{name} bytes 0-10: failed after 2 attempts; last error: .*"):
        src.read(name, 0, 10)
    assert len(proxy.gets()) == 2


def _read_in_child(src: RemoteSource, name: str) -> None:
    try:
        src.read_ranges(name, [(0, 100), (10_000, 100)])
    except ShardIOError as e:
        raise SystemExit(7 if "forked from one that had already read a remote root" in str(e) else 3) from None
    raise SystemExit(0)


def test_a_forked_child_of_a_reader_gets_an_error_not_a_hang(shards, proxy):
    name = EpisodeIndex.open(shards).shards[0].name
    src = RemoteSource(f"s3://{BUCKET}/{PREFIX}", RemoteOptions(gap=0, max_request=1, timeout=5.0))
    src.read_ranges(name, [(0, 10), (5000, 10)])  # this process's obstore runtime is running now
    p = mp.get_context("fork").Process(target=_read_in_child, args=(src, name))
    p.start()
    p.join(20)
    if p.exitcode is None:
        p.kill()
    assert p.exitcode == 7 and len(proxy.gets()) == 2  # the child sent nothing


def test_exhausted_retries_name_the_object_and_range_without_secrets(shards, proxy, caplog):
    caplog.set_level(logging.DEBUG)
    name = EpisodeIndex.open(shards).shards[0].name
    src = open_source(f"s3://{BUCKET}/{PREFIX}", options=RemoteOptions(attempts=3, backoff=0.001))
    errors = []
    for faults in (Faults(error_rate=1.0), Faults(drop_rate=1.0)):
        proxy.reset(faults)
        with pytest.raises(ShardIOError, match=rf"s3://{BUCKET}/{PREFIX}/{name} bytes 100-300: failed after 3 "
                                               rf"attempts") as e:
            src.read(name, 100, 200)
        assert len(proxy.gets()) == 3
        errors.append(e.value)
    proxy.reset()
    with pytest.raises(ShardIOError, match=rf"s3://{BUCKET}/{PREFIX}/shard-999999.tar is missing") as e:
        src.read("shard-999999.tar", 0, 10)
    errors.append(e.value)
    with pytest.raises(ShardIOError, match=rf"{name} ends at byte \d+, the index expects 99999999") as e:
        src.read(name, 99999999 - 10, 10)
    errors.append(e.value)
    with pytest.raises(ShardIOError, match="missing") as e:
        RemoteSource(f"s3://no-such-bucket/{PREFIX}", FAST).size(name)
    errors.append(e.value)
    s3_secrets_absent(repr(src), str(src), repr(src.options), caplog.text, *map(str, errors), *map(repr, errors))
    assert "retrying" in caplog.text
    assert all(x.__cause__ is None and x.__suppress_context__ for x in errors)


def test_names_and_roots_are_checked_before_any_request(proxy):
    src = open_source(f"s3://{BUCKET}/{PREFIX}", options=FAST)
    for bad in ("../other/shard.tar", "s3://x/y", "a/b.tar"):
        with pytest.raises(ValueError, match="plain base name"):
            src.read(bad, 0, 1)
    with pytest.raises(ValueError, match=r"ranges\[1\]"):
        src.read_ranges("shard-000000.tar", [(0, 1), (-1, 2)])
    for root in ("ftp://host/x", "s3://", "https://user:pw@host/x", "ftp://user:pw@host/x", "https://host/x?t=pw"):
        with pytest.raises(ValueError, match="root|credentials") as e:
            open_source(root)
        assert "pw" not in str(e.value)
    for bad in ({"gap": -1}, {"max_in_flight": 0}, {"attempts": 0}, {"timeout": 0}, {"backoff": "1"},
                {"cache_bytes": 1.5}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            RemoteOptions(**bad)
    assert proxy.requests == []


def test_plain_http_root_reads_ranges(shards):
    server = RangeHTTPServer(shards)
    try:
        index = EpisodeIndex.open(shards)
        src = open_source(server.endpoint, options=FAST)
        s = index.shards[0]
        ranges = [(off, n) for name, off, n in _frames(index) if name == s.name]
        assert src.read_ranges(s.name, ranges) == open_source(shards).read_ranges(s.name, ranges)
        assert src.size(s.name) == s.bytes
        assert sum(line.startswith("GET") for line in server.requests) == 1
        with pytest.raises(ShardIOError, match="shard-999999.tar is missing"):
            src.read("shard-999999.tar", 0, 1)
    finally:
        server.close()


def _pinned(index: EpisodeIndex, opts: RemoteOptions) -> RemoteSource:
    """A source whose cache knows the shards by the index's sha256, as `EpisodeIndex.open` makes it (no HEAD)."""
    src = RemoteSource(f"s3://{BUCKET}/{PREFIX}", opts)
    src.pin({s.name: s.sha256 for s in index.shards})
    return src


def test_cache_serves_repeat_reads_without_requests(shards, proxy, tmp_path):
    index = EpisodeIndex.open(shards)
    s = index.shards[0]
    ranges = [(off, n) for name, off, n in _frames(index) if name == s.name]
    opts = RemoteOptions(cache_dir=tmp_path / "cache", cache_bytes=10 << 20, backoff=0.001)
    first = _pinned(index, opts).read_ranges(s.name, ranges)
    assert len(proxy.gets()) == 1
    proxy.reset()
    again = _pinned(index, opts).read_ranges(s.name, ranges)  # another "rank"
    assert again == first == open_source(shards).read_ranges(s.name, ranges)
    assert proxy.requests == []


def test_cache_evicts_least_recently_used_past_its_bound(tmp_path):
    cache = RangeCache(tmp_path, max_bytes=3000)
    for i in range(3):
        cache.put("s3://b/p", "a.tar", "v1", i * 1000, 1000, bytes([i]) * 1000)
        old = time.time() - 100 + i  # entry 0 oldest, entry 2 youngest
        os.utime(cache._path("s3://b/p", "a.tar", "v1", i * 1000, 1000), (old, old))
    assert cache.get("s3://b/p", "a.tar", "v1", 0, 1000) == b"\0" * 1000  # a hit: entry 0 is now the youngest
    cache.put("s3://b/p", "a.tar", "v1", 3000, 1000, b"\3" * 1000)  # over the bound: the least recently used goes
    kept = [cache.get("s3://b/p", "a.tar", "v1", i * 1000, 1000) for i in range(4)]
    assert kept == [b"\0" * 1000, None, b"\2" * 1000, b"\3" * 1000]
    assert sum(p.stat().st_size for p in tmp_path.glob("*.bin")) <= 3000
    assert cache.get("s3://b/p", "other.tar", "v1", 0, 1000) is None
    (tmp_path / ".tmp-dead").write_bytes(b"x")  # a writer killed mid-entry, an hour ago
    os.utime(tmp_path / ".tmp-dead", (time.time() - 4000, time.time() - 4000))
    cache.put("s3://b/p", "a.tar", "v1", 4000, 1000, b"\4" * 1000)
    assert not (tmp_path / ".tmp-dead").exists()
    with pytest.raises(ValueError, match="cache_bytes"):
        RangeCache(tmp_path, max_bytes=0)


def _fill(folder: str, barrier: object) -> None:
    cache = RangeCache(folder, max_bytes=1 << 30)
    data = bytes(range(256)) * 4096  # 1 MiB: big enough for a torn write to be seen
    path = cache._path("s3://b/p", "a.tar", "v1", 0, len(data))
    barrier.wait(60)  # both processes start racing together
    for _ in range(150):
        cache.put("s3://b/p", "a.tar", "v1", 0, len(data), data)
        try:
            raw = path.read_bytes()  # the file itself, not through get(), which drops short entries
        except FileNotFoundError:
            continue
        if raw != data:
            raise SystemExit(3)


def test_two_processes_filling_one_entry_never_see_a_torn_file(tmp_path):
    ctx = mp.get_context("fork")  # the cache is plain file I/O: nothing of the parent's runtime is needed
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_fill, args=(str(tmp_path), barrier)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    entry = RangeCache(tmp_path, 1)._path("s3://b/p", "a.tar", "v1", 0, 1 << 20)
    assert [p.name for p in tmp_path.iterdir()] == [entry.name]
    assert RangeCache(tmp_path, 1 << 30).get("s3://b/p", "a.tar", "v1", 0, 1 << 20) == bytes(range(256)) * 4096


def test_whole_shard_cache_downloads_each_shard_once_for_all_threads(shards, proxy, tmp_path):
    index = EpisodeIndex.open(shards)
    frames = _frames(index)
    opts = RemoteOptions(cache_dir=tmp_path / "cache", cache_bytes=10 << 20, cache_whole=True, backoff=0.001)
    src = _pinned(index, opts)
    local = open_source(shards)
    results: dict[str, list[bytes]] = {}

    def read(shard: str) -> None:
        results[shard] = src.read_ranges(shard, [(o, n) for name, o, n in frames if name == shard])

    threads = [threading.Thread(target=read, args=(s.name,)) for s in index.shards for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(proxy.gets()) == len(index.shards)  # one whole-object GET per shard, not per thread or range
    assert sum(s.bytes for s in index.shards) == proxy.body_bytes
    for s in index.shards:
        assert results[s.name] == local.read_ranges(s.name, [(o, n) for name, o, n in frames if name == s.name])
    proxy.reset()
    again = _pinned(index, opts)  # another rank on this machine
    assert again.read(index.shards[0].name, 7, 1000) == local.read(index.shards[0].name, 7, 1000)
    assert proxy.requests == []
    with pytest.raises(ShardIOError, match=r"ends at byte \d+, the index expects 99999999"):
        again.read(index.shards[0].name, 99999999 - 10, 10)


def test_an_object_too_big_for_the_cache_is_read_by_ranges(shards, proxy, tmp_path):
    name = EpisodeIndex.open(shards).shards[0].name
    opts = RemoteOptions(cache_dir=tmp_path / "cache", cache_bytes=1000, cache_whole=True, backoff=0.001)
    src = RemoteSource(f"s3://{BUCKET}/{PREFIX}", opts)
    assert src.read(name, 100, 50) == (shards / name).read_bytes()[100:150]
    assert src.read(name, 200, 50) == (shards / name).read_bytes()[200:250]
    assert [r[2] for r in proxy.gets()] == [None, "bytes=100-149", "bytes=200-249"]  # one try, then ranges
    assert list((tmp_path / "cache").iterdir()) == []


def test_read_many_fetches_whole_shards_side_by_side_and_ranges_of_many_objects_together(shards, proxy, tmp_path):
    index = EpisodeIndex.open(shards)
    frames = _frames(index)
    calls = [(s.name, [(o, n) for name, o, n in frames if name == s.name][:2]) for s in index.shards]
    local = open_source(shards)
    want = [local.read_ranges(name, rs) for name, rs in calls]
    opts = RemoteOptions(cache_dir=tmp_path / "cache", cache_bytes=10 << 20, cache_whole=True, backoff=0.001)
    proxy.reset(Faults(latency=0.1))
    assert RemoteSource(f"s3://{BUCKET}/{PREFIX}", opts).read_many(calls) == want
    assert len(proxy.gets()) == len(index.shards) and proxy.peak == len(index.shards)  # whole GETs, all at once
    proxy.reset(Faults(latency=0.1))
    assert RemoteSource(f"s3://{BUCKET}/{PREFIX}", FAST).read_many(calls) == want
    assert proxy.peak == len(proxy.gets()) > 1  # every object's ranged GETs in flight together
