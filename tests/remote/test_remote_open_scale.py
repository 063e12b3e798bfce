"""A remote root opens by fetching what is proportional to its episodes, not its frames, and reads per-frame columns
by range on use: counted at the real S3 server (moto) behind the byte-counting proxy."""

from __future__ import annotations

import multiprocessing as mp
import pickle
from pathlib import Path

import numpy as np
import pytest
from remotecases import synthetic_index

from episodepipes.format import COLUMNS
from episodepipes.index import EpisodeIndex, IndexFormatError
from episodepipes.index.columns import PROBE
from episodepipes.pipes import video_pipe
from episodepipes.pipes.plan import metric_items, read_runs
from episodepipes.remote import RemoteOptions, framecolumns
from episodepipes.remote.framecolumns import BLOCK_ROWS, RangeColumn

BUCKET = "scale"
FAST = RemoteOptions(backoff=0.001, max_backoff=0.01, timeout=10.0)
EPISODES, SHARDS = 100, 4
PER_FRAME = ("offset", "size", "crc32")
ROW_BYTES = 8 + 4 + 4  # offset, size and crc32 of one frame


@pytest.fixture(scope="module")
def roots(moto, tmp_path_factory) -> dict[int, Path]:
    """The same 100 episodes in 4 shards, of 10^5 and 10^6 frames (1000 and 10000 an episode), uploaded."""
    out = {}
    for frames in (10**5, 10**6):
        out[frames] = synthetic_index(tmp_path_factory.mktemp("scale") / "s", episodes=EPISODES, frames=frames,
                                      shards=SHARDS)
        moto.upload_dir(out[frames], BUCKET, f"f{frames}")
    return out


def _column_gets(proxy, names=PER_FRAME) -> list[tuple[str, str]]:  # noqa: ANN001
    files = {COLUMNS[n][0]: n for n in names}
    return [(files[p.rsplit("/", 1)[1]], r) for m, p, r in proxy.requests
            if m == "GET" and p.rsplit("/", 1)[1] in files]


def _span(r: str) -> int:
    a, b = r.removeprefix("bytes=").split("-")
    return int(b) - int(a) + 1


def test_bytes_and_requests_at_open_stay_the_same_at_ten_times_the_frames(roots, proxy):
    got = {}
    for frames in roots:
        proxy.reset()
        index = EpisodeIndex.open(f"s3://{BUCKET}/f{frames}", options=FAST)
        assert index.frames == frames and len(index.episodes) == EPISODES
        got[frames] = (len(proxy.requests), proxy.body_bytes)
        # one GET per column: the per-frame ones give their header only (and their size, in the GET's answer)
        assert sorted(_column_gets(proxy)) == sorted((n, f"bytes=0-{PROBE - 1}") for n in PER_FRAME)
    (r1, b1), (r2, b2) = got[10**5], got[10**6]
    assert r1 == r2 == 2 + len(COLUMNS) - 2  # index.json's HEAD and GET, one GET per column (no member/key here)
    assert b2 < 10**6 * ROW_BYTES / 200  # under 0.5% of the per-frame columns
    assert abs(b2 - b1) <= 16  # the JSON says 1000000 where it said 100000, a digit per column shape and in "frames"


def test_lookups_fetch_only_the_blocks_their_episodes_rows_are_in(roots, proxy):
    root, frames = f"s3://{BUCKET}/f{10**6}", 10**6
    index, local = EpisodeIndex.open(root, options=FAST), EpisodeIndex.open(roots[frames])
    val = index.split("val")[::20][:3]  # episodes 1, 41 and 81, blocks apart
    proxy.reset()
    items = metric_items(val, 4)  # the metric pass's plan: a few frames of each validation episode
    assert read_runs(index, items) == read_runs(local, items)
    # the blocks of the episodes' rows (the first lookup in a segment checks all its frames' offsets and sizes)
    blocks = {k for e in val for k in range(e.rows.start // BLOCK_ROWS, (e.rows.stop - 1) // BLOCK_ROWS + 1)}
    gets = _column_gets(proxy)
    assert {n for n, _ in gets} == set(PER_FRAME)  # a frame's offset, size and crc32 come together
    assert proxy.body_bytes == sum(_span(r) for _, r in gets) == len(blocks) * BLOCK_ROWS * ROW_BYTES
    assert proxy.body_bytes < frames * ROW_BYTES / 10
    proxy.reset()  # the same frames again: from the process's blocks, no request
    assert read_runs(index, items) == read_runs(local, items)
    assert proxy.requests == []
    rows = np.array([7, frames - 1, 3 * BLOCK_ROWS + 5, 7])  # a vectorised lookup: every block in one round of GETs
    assert all(np.array_equal(a, b) for a, b in zip(index.frame_ranges(rows), local.frame_ranges(rows)))


def test_a_range_column_indexes_as_numpy_does(roots, proxy):
    frames = 10**5
    index, local = EpisodeIndex.open(f"s3://{BUCKET}/f{frames}", options=FAST), EpisodeIndex.open(roots[frames])
    rng = np.random.default_rng(0)
    keys = [0, -1, frames - 1, np.int64(17), slice(None), slice(5, 9000, 7), slice(None, None, -3), slice(9, 3),
            rng.integers(-frames, frames, 300), rng.integers(0, frames, (4, 5)), [3, 1, 2], rng.random(frames) < 0.01,
            np.array([], np.int64), (slice(10, 20),)]
    for name in PER_FRAME:
        col, arr = index.tables.columns[name], local.tables.columns[name]
        assert isinstance(col, RangeColumn) and (col.shape, col.dtype, len(col)) == (arr.shape, arr.dtype, len(arr))
        for k in keys:
            a, b = col[k], arr[k]
            assert np.asarray(a).dtype == np.asarray(b).dtype and np.array_equal(a, b), (name, k)
        assert np.array_equal(np.asarray(col), arr) and np.array_equal(col.astype(np.int64), arr.astype(np.int64))
        for k in (frames, -frames - 1, np.array([0, frames]), 1.5, np.ones(3, bool)):
            with pytest.raises(IndexError):
                col[k]


def _open_in_child(blob: bytes, episode: int, out, back) -> None:  # noqa: ANN001
    index = pickle.loads(blob)
    out.put(("opened", None))
    back.get()  # the parent counts what unpickling cost, then asks for a lookup
    e = index.episodes[episode]
    out.put(("looked", [e.frame_range(t) for t in range(e.length)]))


@pytest.mark.parametrize("cached", [False, True], ids=["no cache", "cache_dir"])
def test_a_pickled_index_in_a_spawned_process_fetches_no_column_again(roots, proxy, tmp_path, cached):
    opts = RemoteOptions(backoff=0.001, cache_dir=tmp_path / "cache") if cached else FAST
    index = EpisodeIndex.open(f"s3://{BUCKET}/f{10**6}", options=opts)
    local = EpisodeIndex.open(roots[10**6])
    e = index.episodes[42]
    want = [e.frame_range(t) for t in range(e.length)]  # the parent's lookups fetch this episode's blocks
    proxy.reset()
    ctx = mp.get_context("spawn")
    q, back = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=_open_in_child, args=(pickle.dumps(index), 42, q, back))
    p.start()
    try:
        assert q.get(timeout=120) == ("opened", None)
        assert proxy.requests == []  # no index.json, no column: the index came whole in the pickle
        back.put("go")
        kind, got = q.get(timeout=120)
    finally:
        p.join(timeout=60)
    assert kind == "looked" and [tuple(x) for x in got] == want == [local.episodes[42].frame_range(t)
                                                                     for t in range(e.length)]
    if cached:  # the blocks the parent fetched, from the machine's cache_dir
        assert proxy.requests == []
    else:  # only the blocks of the episode's rows, by range
        gets = _column_gets(proxy)
        assert gets and sum(_span(r) for _, r in gets) <= 2 * BLOCK_ROWS * ROW_BYTES
        assert [m for m, _, _ in proxy.requests] == ["GET"] * len(gets)


def test_a_column_cut_short_or_replaced_is_refused_by_name(roots, moto, proxy):
    frames, src = 10**5, roots[10**5]
    name = COLUMNS["offset"][0]
    moto.upload_dir(src, BUCKET, "changed")
    url = f"s3://{BUCKET}/changed"
    client = moto.client()
    data = (src / name).read_bytes()
    client.put_object(Bucket=BUCKET, Key=f"changed/{name}", Body=data[:-8])  # cut short before open: its size
    with pytest.raises(IndexFormatError, match=rf"^{url}/{name} holds {len(data) - 8} bytes: it is not a <u8 column"):
        EpisodeIndex.open(url, options=FAST)
    client.put_object(Bucket=BUCKET, Key=f"changed/{name}", Body=data.replace(b"'<u8'", b"'>u8'", 1))
    with pytest.raises(IndexFormatError, match=rf"^{url}/{name} holds >u8 \[{frames}\], .* says <u8 \[{frames}\]"):
        EpisodeIndex.open(url, options=FAST)  # another header
    client.put_object(Bucket=BUCKET, Key=f"changed/{name}", Body=data)
    index = EpisodeIndex.open(url, options=FAST)
    replaced = bytearray(data)
    replaced[-8:] = b"\xff" * 8  # the same size and header, other rows: replaced after the index was opened
    client.put_object(Bucket=BUCKET, Key=f"changed/{name}", Body=bytes(replaced))
    with pytest.raises(IndexFormatError, match=rf"^{url}/{name} bytes .*: the object changed since it was opened .*"
                                               rf"a column of {url}/index.json"):
        index.episodes[-1].frame_range(0)
    index = EpisodeIndex.open(url, options=FAST)
    client.put_object(Bucket=BUCKET, Key=f"changed/{name}", Body=data[:PROBE])  # cut short after open
    with pytest.raises(IndexFormatError, match=rf"^{url}/{name} (ends at byte {PROBE}|bytes .*changed since)"):
        index.episodes[-1].frame_range(0)


def test_the_block_cache_stays_within_its_bound(roots, proxy):
    frames = 10**6
    block = BLOCK_ROWS * ROW_BYTES
    index = EpisodeIndex.open(f"s3://{BUCKET}/f{frames}", options=RemoteOptions(column_cache_bytes=2 * block))
    local = EpisodeIndex.open(roots[frames])
    rows = np.arange(0, frames, BLOCK_ROWS // 2)  # every block, twice
    assert all(np.array_equal(a, b) for a, b in zip(index.frame_ranges(rows), local.frame_ranges(rows)))
    frames_cols = index.tables.offset._frames  # the bound is what this test checks
    assert isinstance(frames_cols, framecolumns.FrameColumns) and len(frames_cols._blocks) <= 2


def test_a_video_pass_reads_only_its_episodes_blocks(shard_folder, moto, proxy, monkeypatch):
    out = shard_folder("scale-pipe", num_episodes=6, length=8, height=16, width=24)
    moto.upload_dir(out, BUCKET, "pipe")
    monkeypatch.setattr(framecolumns, "BLOCK_ROWS", 8)  # a block per episode of this small dataset
    index, local = EpisodeIndex.open(f"s3://{BUCKET}/pipe", options=FAST), EpisodeIndex.open(out)
    ep = index.episodes[3]
    proxy.reset()
    got = [b["frame"].tolist() for b in video_pipe(index, episodes=[ep.id], batch_size=4, max_batches=10)]
    want = [b["frame"].tolist() for b in video_pipe(local, episodes=[ep.id], batch_size=4, max_batches=10)]
    assert got == want and sum(map(len, got)) == ep.length
    rows = {r // 8 for r in ep.rows}
    gets = _column_gets(proxy)
    assert len(rows) == 1 and sorted(n for n, _ in gets) == sorted(PER_FRAME)  # its one block, of each column
    assert sum(_span(r) for _, r in gets) == 8 * ROW_BYTES


def test_with_cache_whole_the_columns_are_fetched_once_a_machine_and_mapped(roots, proxy, tmp_path):
    frames = 10**5
    opts = RemoteOptions(backoff=0.001, cache_dir=tmp_path / "cache", cache_whole=True)
    url, local = f"s3://{BUCKET}/f{frames}", EpisodeIndex.open(roots[frames])
    rows = np.arange(0, frames, 997)
    for k in range(2):  # two indexes of one machine (as two ranks): the second fetches no column
        index = EpisodeIndex.open(url, options=opts)
        proxy.reset()
        assert all(np.array_equal(a, b) for a, b in zip(index.frame_ranges(rows), local.frame_ranges(rows)))
        gets = _column_gets(proxy)
        if k == 0:  # each column whole, once: what a full shuffle over every row reads anyway
            assert sorted(n for n, _ in gets) == sorted(PER_FRAME)
            assert proxy.body_bytes == sum((roots[frames] / COLUMNS[n][0]).stat().st_size for n in PER_FRAME)
        else:
            assert gets == [] and proxy.body_bytes == 0
    cached = [p for p in (tmp_path / "cache").iterdir() if p.stat().st_size > frames]
    assert len(cached) == len(PER_FRAME)
    for p in cached:  # a cached copy that is not the column checked at open is refused by name, never mapped
        p.write_bytes(p.read_bytes()[:-4])
    index = EpisodeIndex.open(url, options=opts)
    with pytest.raises(IndexFormatError, match=r"the cached copy of s3://scale/f100000/index\.[a-z0-9]+\.npy .*"
                                               "delete it from the cache_dir"):
        index.frame_ranges(rows)


def _look_up_in_child(index: EpisodeIndex, episode: int, out) -> None:  # noqa: ANN001
    e = index.episodes[episode]
    out.put([e.frame_range(t) for t in range(e.length)])


def test_a_forked_worker_keeps_the_blocks_it_inherited(roots, proxy):
    index = EpisodeIndex.open(f"s3://{BUCKET}/f{10**5}", options=FAST)
    e = index.episodes[7]
    want = [e.frame_range(t) for t in range(e.length)]
    proxy.reset()
    ctx = mp.get_context("fork")  # the blocks are plain memory: nothing of the parent's obstore runtime is needed
    q = ctx.Queue()
    p = ctx.Process(target=_look_up_in_child, args=(index, 7, q))
    p.start()
    try:
        assert q.get(timeout=60) == want
    finally:
        p.join(timeout=60)
    assert proxy.requests == []


def test_a_batchs_rows_looked_up_together_serve_its_samples_lookups_after_their_blocks_are_gone(roots, proxy):
    # one block of rows in the cache: a batch of far-apart frames (a full shuffle of a large index) evicts each
    # block as the next comes; a sample's lookups that follow the batch's own must not fetch them again
    options = RemoteOptions(backoff=0.001, max_backoff=0.01, timeout=10.0, column_cache_bytes=BLOCK_ROWS * ROW_BYTES)
    index = EpisodeIndex.open(f"s3://{BUCKET}/f{10**6}", options=options)
    eps = [index.episodes[k] for k in (1, 41, 81)]
    for ep in eps:  # their segments checked first (every frame's offset and size: blocks of their own)
        ep.frame_range(0)
    rows = np.array([ep.rows.start + 7 for ep in eps])
    proxy.reset()
    shard, start, end = index.frame_ranges(rows)
    assert 0 < len(_column_gets(proxy)) <= 3 * len(PER_FRAME)  # a block of each column per row (one is cached)
    proxy.reset()
    assert [ep.frame_range(7) for ep in eps] == list(zip(shard.tolist(), start.tolist(), end.tolist()))
    assert [ep.frame_crc(7) for ep in eps] == index.frame_crcs(rows).tolist()
    assert proxy.requests == []


def test_a_batchs_new_segments_fetch_their_column_blocks_in_one_round(roots, proxy, monkeypatch):
    """A batch of a full shuffle touches a new segment per frame, and each segment's frames are checked on first use
    (one span of its rows each): the blocks of all of them are fetched first in one `read_many` (every GET in flight
    at once), not a round trip per segment, and the lookup after finds them cached."""
    index = EpisodeIndex.open(f"s3://{BUCKET}/f{10**6}", options=FAST)
    local = EpisodeIndex.open(roots[10**6])
    rounds = []
    read_many = index.source.read_many
    monkeypatch.setattr(index.source, "read_many", lambda calls: rounds.append(len(calls)) or read_many(calls))
    rows = np.array([index.episodes[k].rows.start + 5 for k in range(0, 96, 6)])  # 16 episodes' segments
    proxy.reset()
    got = index.frame_ranges(rows)
    assert all(np.array_equal(a, b) for a, b in zip(got, local.frame_ranges(rows)))
    assert rounds == [len(PER_FRAME)]  # one round: a call per column file, each its blocks' ranges
    assert {n for n, _ in _column_gets(proxy)} == set(PER_FRAME)
    index.frame_ranges(rows)
    assert rounds == [len(PER_FRAME)]  # checked and cached: no round more
