"""Local shards mapped under a read lease (`_decode.leases`): frames without a copy, and a writer that cuts a shard
short, from this process or another, waits until the mapping is out of its way: slices held keep their bytes, and the
next read names the shard. Where no lease is granted, frames are preads."""

import mmap
import os
import subprocess
import sys
import threading

import numpy as np
import pytest
from helpers import make_shards

from episodepipes.pipes import EpisodeIndex
from episodepipes.pipes._decode import leases
from episodepipes.pipes._decode.mapped import ShardFrames
from episodepipes.shardio import LocalSource, ShardTruncatedError


def test_this_machine_grants_leases():
    """The tests below need leases (Linux, lease-break-time >= 2 s): fail loudly rather than skip where they are off."""
    assert leases._USABLE, "read leases are off here (/proc/sys/fs/leases-enable, lease-break-time >= 2 s)"

# what `cp` over a shard does: open it for writing, cutting it to nothing, then write other bytes
_CP_OVER = "import sys; open(sys.argv[1], 'wb').write(b'x' * 1000)"


@pytest.fixture
def shard(tmp_path):
    idx = EpisodeIndex.open(make_shards(tmp_path / "s", num_episodes=1, length=6, height=32, width=32,
                                        shard_size=1 << 30))
    ep = idx.episodes[0]
    return idx, idx.shards[0].name, [ep.frame_range(t)[1:] for t in range(ep.length)]


def _fds_of(path: str) -> int:
    return sum(os.path.realpath(f"/proc/self/fd/{fd}") == path for fd in os.listdir("/proc/self/fd"))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("writer", ["this process", "another process"])
def test_a_writer_waits_for_the_mapping_to_go_then_held_slices_keep_their_bytes_and_reads_name_the_shard(
        shard, writer):
    idx, name, frames = shard
    path = str(idx.shard_path(0))
    src = LocalSource(idx.root)
    reader = ShardFrames(src)
    held = [reader.frame(name, a, b) for a, b in frames]
    assert all(isinstance(v.obj, mmap.mmap) for v in held)  # no copy: slices of the leased mapping
    before = [bytes(v) for v in held]
    if writer == "this process":
        os.truncate(path, frames[2][0])
    else:  # well within lease-break-time (45 s by default): the lease is let go, not waited out
        subprocess.run([sys.executable, "-c", _CP_OVER, path], check=True, timeout=20)
    assert [bytes(v) for v in held] == before  # a private copy of the pages they showed: no SIGBUS
    with pytest.raises(ShardTruncatedError, match=name):
        reader.frame(name, *frames[3])
    del held  # the mapping goes with its last slice, and the lease's descriptors with it
    assert _fds_of(os.path.realpath(path)) == 1  # the source's own
    src.close()


def test_without_slices_held_the_mapping_and_its_descriptors_go_when_the_lease_breaks(shard):
    idx, name, frames = shard
    path = os.path.realpath(idx.shard_path(0))
    reader = ShardFrames(LocalSource(idx.root))
    assert bytes(reader.frame(name, *frames[0])) == idx.shard_path(0).read_bytes()[slice(*frames[0])]
    assert _fds_of(path) == 3  # the source's, the lease's and the mapping's
    os.truncate(path, frames[1][0])
    assert _fds_of(path) == 1
    assert bytes(reader.frame(name, *frames[0])) == idx.shard_path(0).read_bytes()[slice(*frames[0])]  # a pread
    with pytest.raises(ShardTruncatedError, match=name):
        reader.frame(name, *frames[1])


def test_a_shard_open_for_writing_is_not_leased_and_is_read_with_preads(shard):
    idx, name, frames = shard
    with open(idx.shard_path(0), "r+b") as w:  # a writer that was there first: no lease is granted
        reader = ShardFrames(LocalSource(idx.root))
        got = reader.frame(name, *frames[0])
        assert isinstance(got.obj, np.ndarray)  # an arena the frame was read into
        w.truncate(frames[1][0])
        with pytest.raises(ShardTruncatedError, match=name):
            reader.frame(name, *frames[1])


def test_a_reader_that_is_done_lets_its_leases_go_with_the_last_slice(shard):
    idx, name, frames = shard
    path = os.path.realpath(idx.shard_path(0))
    src = LocalSource(idx.root)
    reader = ShardFrames(src)
    kept = reader.frame(name, *frames[0])
    del reader
    assert _fds_of(path) == 3  # the slice holds the mapping
    del kept
    assert _fds_of(path) == 1
    src.close()


def test_a_forked_child_reads_with_preads_the_parent_holds_the_leases(shard):
    idx, name, frames = shard
    reader = ShardFrames(LocalSource(idx.root))
    assert isinstance(reader.frame(name, *frames[0]).obj, mmap.mmap)
    pid = os.fork()
    if pid == 0:  # the parent's watcher lets the lease go on a break, and swaps the parent's pages only
        ok = isinstance(reader.frame(name, *frames[1]).obj, np.ndarray)
        os._exit(0 if ok else 1)
    assert os.waitpid(pid, 0)[1] == 0
    assert isinstance(reader.frame(name, *frames[1]).obj, mmap.mmap)


_BARE_CHILD = """
import mmap, os, sys, threading
from episodepipes.pipes._decode import leases
from episodepipes.pipes._decode.mapped import ShardFrames
from episodepipes.shardio import LocalSource
root, name, path = sys.argv[1:]
view = ShardFrames(LocalSource(root)).frame(name, 0, 512)
fds = sum(os.path.realpath(f"/proc/self/fd/{fd}") == path for fd in os.listdir("/proc/self/fd"))
watchers = [t.name for t in threading.enumerate() if t.name == "episodepipes-shard-leases"]
print(isinstance(view.obj, mmap.mmap), fds, watchers, leases.wakeups())
"""


def test_bare_mappings_for_benchmarks_take_no_lease_and_start_no_watcher(shard):
    idx, name, _ = shard
    path = os.path.realpath(idx.shard_path(0))
    env = {**os.environ, leases.BARE: "1"}
    got = subprocess.run([sys.executable, "-c", _BARE_CHILD, str(idx.root), name, path], env=env, check=True,
                         capture_output=True, text=True, timeout=60)
    # a slice of a mapping; the source's descriptor and the mapping's own (no lease's); no watcher thread
    assert got.stdout.split() == ["True", "2", "[]", "0"], got.stderr
    assert leases.BARE in got.stderr  # said, as its reads are unsafe


def test_the_watcher_sleeps_while_nothing_breaks_and_wakes_for_a_break(shard):
    """It must not take the GIL from a pass: no wake in longer than the old half-second sweeps, then one for a
    truncate, which it lets through."""
    idx, name, frames = shard
    reader = ShardFrames(LocalSource(idx.root))
    before = leases.wakeups()
    for _ in range(2):
        assert isinstance(reader.frame(name, *frames[0]).obj, mmap.mmap)
        threading.Event().wait(2 * leases.SWEEP)
    assert leases.wakeups() == before
    os.truncate(idx.shard_path(0), frames[1][0])  # returns once the watcher let the lease go
    assert leases.wakeups() > before
    with pytest.raises(ShardTruncatedError, match=name):
        reader.frame(name, *frames[1])
