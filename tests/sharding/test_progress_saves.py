"""Resume saves every ``save_every`` seconds (`episodepipes.sharding.write.saves`): the newest shard's progress is
saved when due and on the way out; a kill -9 between two saves loses only the shards since the last one, which a
resume deletes and writes again, to the bytes of an uninterrupted run."""

import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from episodepipes.sharding.formats.synthetic import SyntheticReader
from episodepipes.sharding.write import WriteOptions, progress, write_shards
from episodepipes.sharding.write.progress_stats import read_log
from episodepipes.sharding.write.saves import Saves, Snapshot

ROOT = Path(__file__).resolve().parents[2]
SHAPE = {"num_episodes": 12, "length": 6, "height": 16, "width": 16}
SYN = SyntheticReader(**SHAPE)
OPTS = WriteOptions(format="synthetic", shard_size=5_000)
STUCK = """
import sys, time
from pathlib import Path
from episodepipes.sharding.formats.synthetic import SyntheticReader


class Stuck(SyntheticReader):  # hangs at one episode, after saying so, until it is killed
    def read(self, episode_id):
        if episode_id == sys.argv[2]:
            Path(sys.argv[3]).write_text("stuck")
            time.sleep(600)
        return super().read(episode_id)
"""
SCRIPT = """
import sys
sys.path.insert(0, sys.argv[6])
from stuck_reader import Stuck  # a module: encoder processes start from a clean interpreter and import it
from episodepipes.sharding.write import WriteOptions, write_shards

write_shards(Stuck(num_episodes=12, length=6, height=16, width=16), sys.argv[1],
             WriteOptions(format="synthetic", shard_size=5_000), save_every=float(sys.argv[4]),
             workers=int(sys.argv[5]))
"""


class _Crash(RuntimeError):
    pass


class _Crashing(SyntheticReader):
    def read(self, episode_id):
        if episode_id == "ep0009":
            raise _Crash(episode_id)
        return super().read(episode_id)


def _files(d):
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file()}


def _shards(d):
    return sorted(p.name for p in d.glob("shard-*.tar"))


def statsfile_of(d):
    """The statistics an unfinished write's progress records (its statistics log, replayed)."""
    return read_log(d, progress.read(d)["stats_log"], where="test").to_json()


def _snap(n):
    return Snapshot(shards=n, episodes=n, skipped=0, position=n, frame=0, segments=[], splits={}, stats=0)


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    out = tmp_path_factory.mktemp("ref") / "out"
    write_shards(SYN, out, OPTS)
    return _files(out)


def test_saves_write_the_newest_snapshot_when_due_and_the_last_on_the_way_out():
    now, written = [0.0], []
    saves = Saves(10, written.append, clock=lambda: now[0], background=False)
    for n in range(1, 6):  # shards 1..5 finish at t = 3, 6, 9, 12, 15
        now[0] += 3
        saves.shard(_snap(n))
    assert [s.shards for s in written] == [4]  # due at t >= 10: the newest, not the ones before it
    saves.flush()
    assert [s.shards for s in written] == [4, 5] and saves.saved_shards == 5
    saves.flush()  # nothing newer: no save
    saves.shard(_snap(6), final=True)  # the writer's last shard: saved whatever the time
    assert [s.shards for s in written] == [4, 5, 6] and saves.count == 3


def test_every_zero_saves_each_shard_and_nothing_is_saved_after_a_failed_save():
    written = []

    def write(snap):
        if snap.shards == 3:
            raise OSError(28, "No space left on device")
        written.append(snap.shards)

    saves = Saves(0, write)
    saves.shard(_snap(1))
    saves.shard(_snap(2))
    with pytest.raises(OSError):
        saves.shard(_snap(3))
    saves.unsaved = _snap(4)
    saves.flush()  # the progress on disk stays the last one written whole
    assert written == [1, 2] and saves.saved_shards == 2


def test_a_due_save_runs_in_the_background_and_the_writer_waits_only_at_the_last_shard():
    now, written, threads, release = [0.0], [], [], threading.Event()

    def write(snap):
        threads.append(threading.current_thread())
        if snap.shards == 2:
            assert release.wait(60)
        written.append(snap.shards)

    saves = Saves(1, write, clock=lambda: now[0])
    now[0] = 5
    saves.shard(_snap(2))  # due: starts in the background, and blocks there until released
    for n in (3, 4):  # finished while it runs: the writer goes on, the newest snapshot is kept for later
        saves.shard(_snap(n))
    assert written == [] and saves.unsaved.shards == 4 and threads[0] is not threading.current_thread()
    release.set()
    saves.shard(_snap(5), final=True)  # the last shard waits for the save running, then saves in the foreground
    assert written == [2, 5] and saves.saved_shards == 5 and saves.count == 2 and saves.unsaved is None
    assert threads[1] is threading.current_thread()


def test_a_failed_background_save_is_raised_at_the_next_shard_and_nothing_more_is_saved():
    now, written = [0.0], []
    full = OSError(28, "No space left on device")

    def write(snap):
        if snap.shards == 2:
            raise full
        written.append(snap.shards)

    saves = Saves(1, write, clock=lambda: now[0])
    now[0] = 5
    saves.shard(_snap(1))
    saves.wait()
    now[0] = 10
    saves.shard(_snap(2))  # fails in the background
    deadline = time.monotonic() + 60
    while not saves.failed:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    now[0] = 20
    with pytest.raises(OSError) as e:
        saves.shard(_snap(3))
    assert e.value is full  # the same error, in the writer's thread
    saves.shard(_snap(4), final=True)
    saves.unsaved = _snap(5)
    saves.flush()
    assert written == [1] and saves.saved_shards == 1 and saves.failed


def test_a_background_save_on_the_way_out_is_waited_for_then_the_newest_snapshot_saved():
    now, written, release = [0.0], [], threading.Event()

    def write(snap):
        if snap.shards == 1:
            assert release.wait(60)
        written.append(snap.shards)

    saves = Saves(1, write, clock=lambda: now[0])
    now[0] = 5
    saves.shard(_snap(1))
    saves.shard(_snap(2))
    threading.Timer(0.2, release.set).start()
    saves.flush()
    assert written == [1, 2] and saves.saved_shards == 2


@pytest.mark.parametrize("bad", [-1, -0.5, math.nan, math.inf, "1", True, None])
def test_save_every_is_refused_by_name_unless_finite_and_not_negative(tmp_path, bad):
    with pytest.raises(ValueError, match=rf"^save_every={bad!r} should be a finite number of seconds >= 0"):
        write_shards(SYN, tmp_path / "out", OPTS, save_every=bad)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("bad", ["-1", "nan", "inf"])
def test_the_cli_refuses_a_bad_save_every_in_one_line(tmp_path, bad):
    argv = ["write", str(tmp_path), str(tmp_path / "o"), "--save-every", bad]
    res = subprocess.run([sys.executable, "-m", "episodepipes.sharding.cli", *argv], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "--save-every" in res.stderr, res.stderr
    assert not (tmp_path / "o").exists()


def test_an_error_saves_the_last_shards_progress_on_the_way_out(tmp_path, ref):
    crashing = _Crashing(**SHAPE)
    with pytest.raises(_Crash):
        write_shards(crashing, tmp_path / "each", OPTS, save_every=0)
    with pytest.raises(_Crash):
        write_shards(crashing, tmp_path / "rare", OPTS, save_every=3600)  # no save is due before the error
    with pytest.raises(_Crash):
        write_shards(crashing, tmp_path / "bg", OPTS, save_every=1e-9)  # each shard's save due, in the background
    each = progress.read(tmp_path / "each")
    for name in ("rare", "bg"):
        got = progress.read(tmp_path / name)
        assert len(got["shards"]) >= 2 and _shards(tmp_path / name) == [s["name"] for s in got["shards"]]
        for k in ("shards", "episodes", "position", "frame", "segments", "splits", "skipped"):
            assert got[k] == each[k], (name, k)  # the same progress as a save after every shard leaves
        assert statsfile_of(tmp_path / name) == statsfile_of(tmp_path / "each")
    assert write_shards(SYN, tmp_path / "bg", OPTS).resumed
    assert _files(tmp_path / "bg") == ref
    assert write_shards(SYN, tmp_path / "rare", OPTS).resumed
    assert _files(tmp_path / "rare") == ref


def _killed_at(out, episode, every, sig=signal.SIGKILL, workers=1):
    """Run a write of ``out`` in a child process with ``save_every=every``, and send it ``sig`` once it is stuck
    reading ``episode`` (every episode before it has been handed to the writer); returns its stderr."""
    ready = out.parent / f"stuck-{episode}"
    ready.unlink(missing_ok=True)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    (out.parent / "stuck_reader.py").write_text(STUCK)
    child = subprocess.Popen([sys.executable, "-c", SCRIPT, str(out), episode, str(ready), str(every), str(workers),
                              str(out.parent)], cwd=ROOT, env=env, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not ready.exists():
        assert child.poll() is None, child.stderr.read().decode()
        assert time.monotonic() < deadline, "the child never reached the stuck episode"
        time.sleep(0.05)
    time.sleep(0.5)  # the writer thread appends the episode before it (no harm if it is still at it)
    child.send_signal(sig)
    err = child.stderr.read().decode()
    assert child.wait(timeout=60) == -sig, err
    return err


def test_a_kill_9_between_two_saves_resumes_to_the_bytes_of_an_uninterrupted_write(tmp_path, ref):
    out = tmp_path / "out"
    _killed_at(out, "ep0004", 0)  # saved after every shard: the progress names every finished shard
    first = [s["name"] for s in progress.read(out)["shards"]]
    assert first and _shards(out) == first
    _killed_at(out, "ep0010", 3600)  # resumed, then no save is due before the kill
    names, recorded = _shards(out), [s["name"] for s in progress.read(out)["shards"]]
    assert recorded == first and len(names) > len(recorded)  # shards finished since the last save, not recorded
    for name in names:  # each one whole, as the uninterrupted run's
        assert (out / name).read_bytes() == ref[name]
    res = write_shards(SYN, out, OPTS)
    assert res.resumed and res.frames_written < res.frames
    assert _files(out) == ref


@pytest.mark.parametrize("workers", [1, 2])
def test_sigterm_saves_the_last_finished_shard_and_ends_the_process_by_sigterm(tmp_path, ref, workers):
    out = tmp_path / "out"
    err = _killed_at(out, "ep0010", 3600, signal.SIGTERM, workers)  # no save is due before the signal
    shards = progress.read(out)["shards"]
    assert len(shards) >= 2 and _shards(out) == [s["name"] for s in shards], err  # every finished shard named
    assert "stopped by SIGTERM" in err and not (out / "_spool").exists()
    assert not (out / "_write.lock").exists()  # unwound: the lock let go (a killed writer leaves its file)
    res = write_shards(SYN, out, OPTS)  # the lock was let go: no LockedError
    assert res.resumed and res.frames_written == res.frames - sum(s["samples"] for s in shards)  # nothing redone
    assert _files(out) == ref


def test_the_sigterm_handler_is_only_for_the_write_and_only_in_the_main_thread(tmp_path):
    before = signal.getsignal(signal.SIGTERM)
    write_shards(SYN, tmp_path / "main", OPTS)
    assert signal.getsignal(signal.SIGTERM) is before
    done = []
    t = threading.Thread(target=lambda: done.append(write_shards(SYN, tmp_path / "thread", OPTS)))
    t.start()
    t.join(120)
    assert done and done[0].frames == SHAPE["num_episodes"] * SHAPE["length"]
    assert signal.getsignal(signal.SIGTERM) is before
