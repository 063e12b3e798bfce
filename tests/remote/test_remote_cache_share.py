"""Ranks of one machine sharing a range cache fetch an entry once: the one that claims it fetches, the others wait
for it; a claim left by a dead process, or one never filled, does not block a reader."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from remotecases import upload_synthetic
from s3server import Faults

from episodepipes.index import EpisodeIndex
from episodepipes.remote import RangeCache, RemoteOptions, RemoteSource
from episodepipes.shardio import open_source

BUCKET, PREFIX = "share", "v1"
URL = f"s3://{BUCKET}/{PREFIX}"


# its own, not `shard_folder`: uploaded to moto by `remotecases.upload_synthetic` (the remote suites' one)
@pytest.fixture(scope="module")
def shards(moto, tmp_path_factory) -> Path:
    return upload_synthetic(moto, tmp_path_factory.mktemp("share") / "shards", BUCKET, PREFIX)


def _calls(shards: Path) -> list[tuple[str, list[tuple[int, int]]]]:
    """Every frame of every shard, a block (one coalesced GET) per shard."""
    index = EpisodeIndex.open(shards)
    by: dict[str, list[tuple[int, int]]] = {}
    for ep in index.episodes:
        for f in range(ep.length):
            shard, a, b = ep.frame_range(f)
            by.setdefault(index.shards[shard].name, []).append((a, b - a))
    return [(n, [(r[0][0], r[-1][0] + r[-1][1] - r[0][0])]) for n, r in by.items()]  # one range per shard


def _want(shards: Path, calls) -> list[list[bytes]]:
    return [open_source(shards).read_ranges(n, rs) for n, rs in calls]


def test_ranks_reading_the_same_ranges_at_once_fetch_each_once(shards, proxy, tmp_path):
    calls = _calls(shards)
    opts = RemoteOptions(cache_dir=tmp_path / "cache", backoff=0.001)
    proxy.reset(Faults(latency=0.1))  # long enough that the ranks' reads overlap
    got: dict[int, list[list[bytes]]] = {}
    start = threading.Barrier(4)

    def rank(r: int) -> None:
        src = RemoteSource(URL, opts)  # a source (and cache object) of its own, as in another process
        start.wait()
        got[r] = src.read_many(calls)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(got[r] == _want(shards, calls) for r in range(4))
    assert len(proxy.gets()) == len(calls)  # each shard's range once, not once per rank
    assert not list((tmp_path / "cache").glob("*.lock"))


def test_a_stale_claim_is_taken_over_and_a_claim_never_filled_is_waited_for_a_bound(shards, proxy, tmp_path):
    calls = _calls(shards)[:1]
    (name, [(off, n)]) = calls[0]
    pins = {s.name: s.sha256 for s in EpisodeIndex.open(shards).shards}
    ident = f"sha256:{pins[name]}"  # the entry's identity in a source that the index pins, as EpisodeIndex.open does
    cache = RangeCache(tmp_path / "cache", 1 << 30)
    assert cache.claim(URL, name, ident, off, n)  # a process that died while fetching
    lock = next((tmp_path / "cache").glob("*.lock"))
    os.utime(lock, (time.time() - 3600, time.time() - 3600))
    quick = RemoteOptions(cache_dir=tmp_path / "cache", backoff=0.001, max_backoff=0.0, timeout=0.3, attempts=1)
    src = RemoteSource(URL, quick)
    src.pin(pins)
    assert src.read_many(calls) == _want(shards, calls)
    assert len(proxy.gets()) == 1 and not lock.exists()
    other = RangeCache(tmp_path / "cache2", 1 << 30)
    assert other.claim(URL, name, ident, off, n)  # alive, but it never fills the entry
    proxy.reset()
    t = time.monotonic()
    src = RemoteSource(URL, replace(quick, cache_dir=tmp_path / "cache2"))
    src.pin(pins)
    assert src.read_many(calls) == _want(shards, calls)
    assert 0.25 <= time.monotonic() - t and len(proxy.gets()) == 1  # waited its bound, then fetched itself
