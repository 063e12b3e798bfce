"""Issue 25 by counting: opening costs nothing per episode, a frame lookup copies no column, ``where=`` is called
per distinct attribute combination; on synthetic indexes laid out as the writer lays them (`benchmarks.scale_index`)."""

import gc
import tracemalloc

import numpy as np
import pytest

from benchmarks import scale_index
from episodepipes.index import EpisodeIndex
from episodepipes.index.search import STEP, Sorted
from episodepipes.pipes.select import attributes, keep_numbers, select


@pytest.fixture(scope="module")
def sizes(tmp_path_factory):
    root = tmp_path_factory.mktemp("scale")
    return {n: scale_index.make(root / f"e{n}", n, length=2) for n in (1_000, 10_000, 100_000)}


def _blocks_after_open(path):
    """Memory blocks (Python objects, numpy buffers) an open index holds, counted by tracemalloc."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        index = EpisodeIndex.open(path)
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    count = sum(s.count_diff for s in after.compare_to(before, "filename"))
    return index, count


def test_opening_makes_no_object_per_episode(sizes):
    _blocks_after_open(sizes[1_000])  # imports and the per-process caches out of the count
    small, at_10k = _blocks_after_open(sizes[10_000])
    big, at_100k = _blocks_after_open(sizes[100_000])
    assert len(big.episodes) == 100_000 and big.episode("ep0099999").meta == {"robot": "widowx"}
    # 90,000 more episodes, not one more object each (on main: 79,859 and 800,003 blocks); 18 more shards, a few each
    assert abs(at_100k - at_10k) < 300, (at_10k, at_100k)
    assert at_100k < 2_000


def _lookup_peak(index, rows):
    """The most memory `frame_ranges` of ``rows`` holds at once beyond what was held before (tracemalloc)."""
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        index.frame_ranges(rows)
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


def test_a_frame_lookup_allocates_the_same_at_100x_the_episodes(sizes):
    """Before: np.searchsorted on a strided column copied it whole, 8 bytes per segment on every new lookup."""
    peaks = {}
    for n in (1_000, 100_000):
        index = EpisodeIndex.open(sizes[n])
        index.frame_ranges(np.arange(2))  # the first use's sample of the column (1 value in STEP) out of the count
        peaks[n] = max(_lookup_peak(index, np.arange(2 * k, 2 * k + 2)) for k in (n // 3, n // 2, n - 1))
    assert peaks[100_000] < 2 * peaks[1_000], peaks  # on main: 9 KB and 801 KB, a copy of the column
    assert peaks[100_000] < 16 * 1024, peaks


def test_an_episode_found_by_id_and_its_first_frame_copy_no_column(sizes):
    index = EpisodeIndex.open(sizes[100_000])
    index.episode("ep0000001").frame_range(0)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        e = index.episode("ep0076543")
        e.frame_range(1)  # its segments found and checked on first use
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert e.number == 76543 and peak < 16 * 1024, peak
    assert index.numbers(["ep0000010", "nope", "ep0099999", "../x", "ep00000100"]).tolist() == [10, -1, 99999, -1, -1]
    with pytest.raises(KeyError, match=r"'ep00765430' is not in .*close matches: \['ep0076543'"):
        index.episode("ep00765430")


def test_where_is_called_per_distinct_attributes_and_keeps_what_a_per_episode_loop_keeps(sizes):
    index = EpisodeIndex.open(sizes[10_000])
    calls = {"n": 0}

    def counted(pred):
        def where(a):
            calls["n"] += 1
            return pred(a)
        return where

    everything = [attributes(e) for e in index.episodes]
    for pred, most in ((lambda a: a["robot"] == "aloha" and a["split"] == "val", 2 * 20 * 4),  # splits x tasks x robots
                       (lambda a: a.get("robot") in ("ur5",) and a["length"] >= 2, 2 * 20 * 4 * 2),
                       (lambda a: a["id"].endswith("7") and "robot" in a, 10_000 + 2 * 20 * 4)):
        calls["n"] = 0
        kept = keep_numbers(index, np.arange(10_000), counted(pred))
        assert calls["n"] <= most, calls
        assert kept.tolist() == [n for n, a in enumerate(everything) if pred(a)]
    calls["n"] = 0
    assert [e.id for e in select(index, "val", where=counted(lambda a: sorted(a) == sorted(everything[0])))][:2] == \
        ["ep0000000", "ep0000010"]  # a predicate that reads the whole dict sees every episode's own
    assert calls["n"] >= 1_000
    with pytest.raises(TypeError, match=r"where= returned 'x' for episode 'ep\d{7}'; it should return True"):
        select(index, None, where=lambda a: "x")


def test_episodes_are_grouped_alike_with_or_without_a_sort(sizes):
    from episodepipes.pipes.select import _groups

    t = EpisodeIndex.open(sizes[10_000]).tables
    for numbers in (np.arange(10_000), np.arange(3, 10_000, 7), np.array([5, 2, 9000])):
        (g1, f1), (g2, f2) = _groups(t, numbers), _groups(t, numbers, sort=True)
        assert (f1[g1] == f1[g1][0]).sum() == (f2[g2] == f2[g2][0]).sum()  # the same partition, numbered apart
        assert np.array_equal(g1[f1], np.arange(len(f1))) and np.array_equal(g2[f2], np.arange(len(f2)))
        pairs = set(zip(g1.tolist(), g2.tolist()))
        assert len(pairs) == len(f1) == len(f2)


def test_sorted_search_equals_numpy_on_strided_columns():
    rng = np.random.default_rng(0)
    for n in (0, 1, 5, STEP - 1, STEP, STEP + 1, 3 * STEP + 7, 10_000, 100_000):
        table = np.zeros((n, 3), np.uint64)
        table[:, 1] = np.cumsum(rng.integers(1, 4, n)).astype(np.uint64)
        col = table[:, 1]
        assert not col.flags.c_contiguous or n <= 1
        top = int(col[-1]) + 3 if n else 3
        many = np.concatenate([np.arange(0, top), rng.integers(0, 2**40, 5)])  # every window: searched together
        for values in (many, rng.integers(0, top, 3), np.array([top - 3])):  # a few windows: each copied
            for side in ("left", "right"):
                got = Sorted(col).search(values, side=side)
                assert got.tolist() == np.searchsorted(col, values.astype(np.uint64), side=side).tolist(), (n, side)


def test_a_lookup_given_its_episodes_reads_their_rows_only(sizes):
    """A train batch's lookup knows each frame's episode: it reads those episodes' rows of the tables, not a sample
    of a whole column (whose first use touches a page of it per `STEP` rows, what grows with the episodes)."""
    peaks = {}
    for n in (1_000, 100_000):
        index = EpisodeIndex.open(sizes[n])
        numbers = np.random.default_rng(0).choice(n, size=256, replace=False)
        rows = index.tables.episodes[numbers, 0].astype(np.int64) + 1  # each episode's second frame
        tracemalloc.start()
        try:
            got = index.frame_ranges(rows, numbers)
            peaks[n] = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert index.tables._search == {}  # no column was sampled or searched
        assert all(np.array_equal(a, b) for a, b in zip(got, EpisodeIndex.open(sizes[n]).frame_ranges(rows)))
        with pytest.raises(ValueError, match="not in the episode given"):
            index.frame_ranges(rows, (numbers + 1) % n)
    assert peaks[100_000] < 2 * peaks[1_000], peaks


def _vm_flags(path):
    """The VmFlags of this process's mapping of ``path`` (/proc/self/smaps)."""
    lines = open("/proc/self/smaps").read().splitlines()
    for k, line in enumerate(lines):
        if line.endswith(str(path)):
            return next(x for x in lines[k + 1:] if x.startswith("VmFlags:")).split()[1:]
    raise AssertionError(f"{path} is not mapped")


def test_per_frame_columns_are_mapped_for_random_reads_and_scans_read_around(sizes):
    """A fault on a mapped file reads around it (the device's read_ahead_kb, megabytes on some machines): a batch's
    rows at random would each read that much of a cold per-frame column. They are advised random ("rr") once the
    open's checks have read them; a scan of every segment (verify, upgrade) has read-around back while it runs."""
    from episodepipes.index.columns import scanning

    index = EpisodeIndex.open(sizes[10_000])
    t = index.tables
    for name in ("offset", "size", "crc32"):
        assert "rr" in _vm_flags(sizes[10_000] / f"index.{name}.npy"), name
    assert "rr" not in _vm_flags(sizes[10_000] / "index.episodes.npy")
    with scanning([t.offset]):
        assert "rr" not in _vm_flags(sizes[10_000] / "index.offset.npy")
    assert "rr" in _vm_flags(sizes[10_000] / "index.offset.npy")


def _resident_kb(path):
    """This process's resident kB of its mapping of ``path`` (/proc/self/smaps): the pages it holds mapped."""
    lines = open("/proc/self/smaps").read().splitlines()
    for k, line in enumerate(lines):
        if line.endswith(str(path)):
            return int(next(x for x in lines[k + 1:] if x.startswith("Rss:")).split()[1])
    return 0


def test_opening_checks_every_table_row_but_keeps_none_of_their_pages_mapped(sizes):
    """A mapped page this process alone maps counts as its private memory once touched: the open's checks read every
    row of the episode tables and id columns (a block at a time) and unmap each block's pages after (the page cache
    keeps them, shared). Before: all of them stayed, 100 MB at 10**6 episodes."""
    path = sizes[100_000]
    index = EpisodeIndex.open(path)
    for name in ("episodes", "segments", "ids", "id_order", "attr"):
        size = (path / f"index.{name}.npy").stat().st_size
        assert _resident_kb(path / f"index.{name}.npy") * 1024 < max(size // 4, 64 * 1024), name  # fault-around
    assert len(index.split_numbers("val")) == 10_000  # a scan of the table, released as it goes
    assert _resident_kb(path / "index.episodes.npy") * 1024 < (path / "index.episodes.npy").stat().st_size // 4
    assert index.episode("ep0099999").meta == {"robot": "widowx"}  # read again on use


def test_a_batch_of_new_segments_asks_for_their_pages_together(sizes, monkeypatch):
    """The per-frame columns are read at random (one page per fault), so a batch's cold pages would be read one
    after another: a lookup touching many new segments asks for all their rows' pages first (MADV_WILLNEED), in
    one range per run of near pages, and a lookup of segments already checked asks for none."""
    from episodepipes.index import columns, tables

    asked = []

    def counting(arrays, starts, ends):
        asked.append((len(starts), columns.prefetch(arrays, starts, ends)))
        return asked[-1][1]

    monkeypatch.setattr(tables, "prefetch", counting)
    index = EpisodeIndex.open(sizes[100_000])
    picks = np.random.default_rng(0).choice(100_000, size=64, replace=False)
    rows = np.sort(picks) * 2  # two frames an episode: each pick's first frame, a segment each
    index.frame_ranges(rows, np.sort(picks))
    want = 0  # runs of the pages the 64 segments' rows are on, in each of offset, size and crc32
    for name, width in (("offset", 8), ("size", 4), ("crc32", 4)):
        path = sizes[100_000] / f"index.{name}.npy"
        head = path.stat().st_size - 200_000 * width  # the .npy header before the rows
        pages = sorted({(head + r * width + d) // 4096 for r in rows.tolist() for d in (0, 2 * width - 1)})
        want += 1 + sum(b - a > columns.PREFETCH_GAP for a, b in zip(pages, pages[1:]))
    assert asked == [(64, want)] and want > 3
    index.frame_ranges(rows, np.sort(picks))
    index.frame_ranges(np.setdiff1d(np.arange(20), picks)[:3] * 2)  # a few new segments: no prefetch call
    assert asked == [(64, want)]


def test_prefetch_asks_for_one_range_per_run_of_near_pages(sizes):
    """Rows on pages at most `PREFETCH_GAP` apart are asked for in one range; a row range spanning pages is
    asked for whole; unmapped arrays are skipped."""
    from episodepipes.index.columns import PREFETCH_GAP, prefetch

    index = EpisodeIndex.open(sizes[100_000])
    off = index.tables.offset  # <u8: 512 rows per page
    assert prefetch([off], np.array([0]), np.array([1])) == 1
    near, far = 512 * PREFETCH_GAP, 512 * (PREFETCH_GAP + 2)
    assert prefetch([off], np.array([0, near, near + far]), np.array([1, near + 1, near + far + 1])) == 2
    assert prefetch([off], np.array([far, 0]), np.array([far + 1, 2 * far])) == 1  # the second spans the first
    assert prefetch([np.zeros(10, np.uint64)], np.array([0]), np.array([1])) == 0
