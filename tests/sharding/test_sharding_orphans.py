"""A writer killed mid-write (a test's timeout, a scheduler's SIGKILL) takes its encoder processes with it: they
must not live on as orphans, stuck or spinning, holding the CPU and the output pipes of whoever started the write."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STUCK = """
import os, sys, time
from episodepipes.sharding.formats.synthetic import SyntheticReader

class Stuck(SyntheticReader):
    def read(self, episode_id):
        with open(sys.argv[1], "a") as f:
            f.write(f"{os.getpid()}\\n")
        while True:  # an encoder that never finishes
            time.sleep(0.05)
"""
SCRIPT = """
import sys
sys.path.insert(0, sys.argv[3])
from stuck import Stuck  # a module: encoder processes start from a clean interpreter and import what tasks name
from episodepipes.sharding.write import WriteOptions, write_shards

write_shards(Stuck(num_episodes=4, length=3, height=16, width=16), sys.argv[2], WriteOptions(format="synthetic"),
             workers=2)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is dead, only not reaped yet
    except FileNotFoundError:
        return False


def test_encoder_processes_die_with_a_killed_writer(tmp_path):
    log = tmp_path / "workers.log"
    (tmp_path / "stuck.py").write_text(STUCK)
    parent = subprocess.Popen([sys.executable, "-c", SCRIPT, str(log), str(tmp_path / "out"), str(tmp_path)], cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while len(workers) < 2 and time.monotonic() < deadline and parent.poll() is None:
            time.sleep(0.1)
            workers = sorted({int(x) for x in log.read_text().split()}) if log.exists() else []
        assert len(workers) == 2 and parent.poll() is None, (workers, parent.poll())
        parent.kill()
        parent.wait(timeout=30)
        deadline = time.monotonic() + 10
        while any(map(_alive, workers)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [p for p in workers if _alive(p)]
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(timeout=30)
        for pid in workers:  # only the processes this test started
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_reader_class_in_an_interactive_main_is_refused_by_name(tmp_path):
    # encoder processes start from a clean interpreter: a class only `python -c` (or a notebook) has cannot reach them
    script = """
from episodepipes.sharding.formats.synthetic import SyntheticReader
from episodepipes.sharding.write import WriteOptions, write_shards

class Mine(SyntheticReader):
    pass

write_shards(Mine(num_episodes=2, length=2, height=16, width=16), OUT, WriteOptions(format="synthetic"), workers=2)
""".replace("OUT", repr(str(tmp_path / "out")))
    run = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1
    assert run.stderr.strip().splitlines()[-1] == (
        "ValueError: reader class Mine is defined in __main__ of an interactive session or `python -c`, which "
        "encoder processes cannot import; define it in a module (a .py file) or write with workers=1")


def test_a_main_read_from_stdin_is_refused_by_name(tmp_path):
    # spawned processes import the main module from its file; "<stdin>" is none, and each encoder would die of it
    script = """
from episodepipes.sharding.formats.synthetic import SyntheticReader
from episodepipes.sharding.write import WriteOptions, write_shards

write_shards(SyntheticReader(num_episodes=2, length=2, height=16, width=16), OUT, WriteOptions(format="synthetic"),
             workers=2)
""".replace("OUT", repr(str(tmp_path / "out")))
    run = subprocess.run([sys.executable, "-"], input=script, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1
    assert run.stderr.strip().splitlines()[-1].startswith(
        "ValueError: the main module's file '<stdin>' does not exist, and encoder processes import it")
