"""How pooled encoders hand an episode's tar bytes to the writer: shared-memory slots, or a spool file when an
episode is larger than a slot. Either way the writer gets exactly the bytes an in-process encode gives."""

import hashlib
import io
import os
import re
import signal
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import pytest

from episodepipes.errors import WorkerError
from episodepipes.index import EpisodeIndex
from episodepipes.sharding.formats.synthetic import SyntheticReader
from episodepipes.sharding.write import WriteOptions, write_shards
from episodepipes.sharding.write.encode import EncodeOptions
from episodepipes.sharding.write.encoders import encoded, samples

SYN = SyntheticReader(num_episodes=5, length=6, height=48, width=64, lengths=(6, 3, 9, 4, 7))


def _tasks(spool):
    return [(SYN, eid, None, False, EncodeOptions(), spool) for eid in SYN.episode_ids()]


def _taken(results, spool):
    """(meta, bytes, sizes) of each result, and whether it came as a spool file still on disk then."""
    out = []
    for res in results:
        assert res[0] == "ok", res
        spooled = isinstance(res[2][0], str) and (spool / f"{res[1]['id']}.samples").exists()
        with samples(res[2]) as (data, sizes):
            out.append((res[1], bytes(data), list(sizes), spooled))
    return out


@pytest.mark.parametrize("slot_bytes", [64 * 2**20, 40_000, 0])  # every episode fits; some do; none (spool)
def test_pooled_results_are_the_in_process_bytes_whatever_carries_them(tmp_path, slot_bytes):
    spool = tmp_path / "spool"
    spool.mkdir()
    ref = _taken(encoded(_tasks(None), 1), spool)
    got = _taken(encoded(_tasks(str(spool)), 2, slot_bytes=slot_bytes), spool)
    assert [r[:3] for r in got] == [r[:3] for r in ref]
    spooled = [r[3] for r in got]
    assert spooled == [len(r[1]) > slot_bytes for r in ref]  # a slot when it fits, else the episode's spool file
    assert 0 < sum(len(r[1]) > 40_000 for r in ref) < len(ref)  # the middle case has both kinds
    assert not list(spool.iterdir())  # every spool file is gone once taken


def test_a_slot_is_reused_only_after_its_result_was_taken(tmp_path):
    # 9 episodes through 2 workers' 4 slots: each slot carries several episodes in turn, and every result
    # still holds its own bytes when the writer reads it, although the encoders run ahead of it
    reader = SyntheticReader(num_episodes=9, length=4, height=32, width=32)
    tasks = [(reader, eid, None, False, EncodeOptions(), str(tmp_path)) for eid in reader.episode_ids()]
    want = [hashlib.sha256(r[2][0]).hexdigest() for r in encoded([(*t[:-1], None) for t in tasks], 1)]
    got = []
    for res in encoded(tasks, 2):
        assert isinstance(res[2][0], memoryview)  # a view of the slot, not a copy
        got.append(hashlib.sha256(res[2][0]).hexdigest())
    assert got == want


def test_shards_from_pooled_slots_are_the_tarfile_reference_bytes(tmp_path):
    # the pool's shards, byte for byte, as Python's tarfile writes the same members with the same metadata
    out = tmp_path / "out"
    write_shards(SYN, out, WriteOptions(format="synthetic", shard_size=50_000), workers=2)
    shards = sorted(out.glob("shard-*.tar"))
    assert len(shards) > 1
    for path in shards:
        raw = path.read_bytes()
        with tarfile.open(path) as tar:
            members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]
        ref = tmp_path / "ref.tar"
        with tarfile.open(ref, "w", format=tarfile.GNU_FORMAT) as tar:
            for m, data in members:
                info = tarfile.TarInfo(m.name)
                info.size, info.mtime, info.mode, info.uid, info.gid, info.uname, info.gname = (
                    len(data), 0, 0o644, 0, 0, "", "")
                tar.addfile(info, io.BytesIO(data))
        # tarfile pads the archive to a 10 KiB record; the shard ends at its two zero blocks
        assert ref.read_bytes()[:len(raw)] == raw and not ref.read_bytes()[len(raw):].strip(b"\0")


HELD = threading.Lock()  # held by the writer's process while its pool starts (the test below)


class _Locking(SyntheticReader):
    """Takes `HELD` for every episode it reads: a lock of the module as the encoder process has it."""

    def read(self, eid):
        with HELD:
            return super().read(eid)


class _Dying(SyntheticReader):
    """Kills the encoder process that reads episode ``victim`` (SIGKILL, as the OOM killer does)."""

    def __init__(self, victim, **kw):
        super().__init__(**kw)
        self.victim, self.writer = victim, os.getpid()

    def read(self, eid):
        if eid == self.victim and os.getpid() != self.writer:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().read(eid)


def _bounded(fn, seconds=60):
    """``fn()`` in a daemon thread; its error re-raised; a call still running after ``seconds`` fails the test (the
    thread is left behind), where waiting for it would hang the run."""
    out = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised in the test's thread
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        pytest.fail(f"still running after {seconds} s: hung")
    if "error" in out:
        raise out["error"]
    return out.get("value")


def test_encoders_do_not_inherit_a_lock_the_writer_holds(tmp_path):
    # a forked encoder got the writer's locks as they were at the fork: one held then (here by the writer itself;
    # in the field by a thread beside it: a logging handler, libav, the background save) was held forever in the child
    reader = _Locking(num_episodes=4, length=3, height=32, width=32)
    with HELD:
        _bounded(lambda: write_shards(reader, tmp_path / "out", WriteOptions(format="synthetic"), workers=2))
    assert [e.id for e in EpisodeIndex.open(tmp_path / "out").episodes] == reader.episode_ids()


def test_an_encoder_killed_mid_write_is_an_error_naming_the_episodes_in_flight(tmp_path):
    # a result lost with its worker was a wait without end (multiprocessing.Pool); now the write ends, naming it
    reader = _Dying("ep0003", num_episodes=6, length=3, height=32, width=32)
    assert "ep0003" in reader.episode_ids()
    died = r"an encoder process died \(.*exit code -9.*\) with episodes .*'ep0003'.* in flight"
    with pytest.raises(WorkerError, match=died) as err:
        _bounded(lambda: write_shards(reader, tmp_path / "out", WriteOptions(format="synthetic"), workers=2))
    pids = [int(p) for p in re.findall(r"pid (\d+)", str(err.value))]
    assert len(pids) == 2
    deadline = time.monotonic() + 10
    while any(os.path.exists(f"/proc/{p}") for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)  # the fork server reaps its children as they end
    assert not [p for p in pids if os.path.exists(f"/proc/{p}")]  # the other encoder was stopped, not left running


DYING_SCRIPT = f"""
import sys
sys.path[:0] = [{str(Path(__file__).resolve().parent)!r}]
from test_sharding_write_transfer import _Dying
from episodepipes.sharding.cli import main
from episodepipes.sharding.formats.readers import register_format

register_format("dying", lambda root: _Dying("ep0002", num_episodes=5, length=3, height=16, width=16))
sys.exit(main(sys.argv[1:]))
"""


def test_the_cli_reports_a_killed_encoder_in_one_line(tmp_path):
    cmd = [sys.executable, "-c", DYING_SCRIPT, "write", str(tmp_path), str(tmp_path / "out"), "--format", "dying",
           "--workers", "2"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and run.stderr.count("\n") == 1, run.stderr
    assert "an encoder process died" in run.stderr and "'ep0002'" in run.stderr and "fewer workers" in run.stderr
