import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import write_raw

from episodepipes.sharding.cli import main
from episodepipes.sharding.readers import FORMATS, Format
from episodepipes.sharding.synthetic import SyntheticReader

ROOT = Path(__file__).resolve().parent.parent
SMALL = SyntheticReader(num_episodes=3, length=6, height=32, width=40)


def _files(d):
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file()}


def _fails(capsys, argv, *needles):
    """The command exits 2 with one error line that names every needle, and no traceback."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1 and err.startswith("episodepipes-shard: error:")
    for needle in needles:
        assert needle in err, (needle, err)
    return err


def test_write_info_verify(tmp_path, capsys):
    src = write_raw(tmp_path / "src", SMALL)
    out = tmp_path / "out"
    assert main(["write", str(src), str(out), "--shard-size", "20kB", "--workers", "1", "--resize", "24x32"]) == 0
    assert "wrote 3 episodes, 18 frames" in capsys.readouterr().out
    assert main(["info", str(out)]) == 0
    info = capsys.readouterr().out
    for line in ("episodes  3 (train 2, val 1)", "frames    18 (train 12, val 6)", "front 24x32 (3 ep)", "fps"):
        assert line in info
    assert main(["verify", str(out)]) == 0 and capsys.readouterr().out.endswith("ok\n")
    _fails(capsys, ["write", str(src), str(out)], "index.json exists", "--overwrite")
    assert main(["write", str(src), str(out), "--overwrite", "--workers", "1", "--val-episodes", "ep0000"]) == 0


def test_verify_names_shard_and_episode(tmp_path, capsys):
    src = write_raw(tmp_path / "src", SMALL)
    out = tmp_path / "out"
    assert main(["write", str(src), str(out), "--shard-size", "20kB", "--workers", "1"]) == 0
    shard = out / "shard-000001.tar"
    blob = bytearray(shard.read_bytes())
    blob[700] ^= 0xFF
    shard.write_bytes(bytes(blob))
    data = json.loads((out / "index.json").read_text())
    seg = data["episodes"][-1]["segments"][-1]
    seg["offsets"][-1] += 512  # the index now points into the middle of a frame
    (out / "index.json").write_text(json.dumps(data))
    capsys.readouterr()
    assert main(["verify", str(out)]) == 1
    err = capsys.readouterr().err
    users = [e["id"] for e in data["episodes"] if any(s["shard"] == 1 for s in e["segments"])]
    assert f"shard {shard.name}: sha256 mismatch (episodes {', '.join(users)})" in err
    moved = data["shards"][seg["shard"]]["name"]
    assert f"shard {moved}: episode {data['episodes'][-1]['id']!r} frame " in err


def test_input_errors_exit_2_with_one_line(tmp_path, capsys):
    src = write_raw(tmp_path / "src", SMALL)
    (tmp_path / "file").write_text("")
    _fails(capsys, ["write", str(tmp_path / "nope"), str(tmp_path / "o")], "nope", "does not exist")
    _fails(capsys, ["write", str(src), str(tmp_path / "o"), "--format", "hdf5"], "unknown format 'hdf5'")
    _fails(capsys, ["write", str(src), str(tmp_path / "file" / "o")], "file/o", "writable")
    _fails(capsys, ["write", str(src), str(tmp_path / "o"), "--shard-size", "12 parsecs"], "12 parsecs")
    _fails(capsys, ["write", str(src), str(tmp_path / "o"), "--val-episodes", "ep9"], "ep9")
    _fails(capsys, ["info", str(tmp_path / "nope")], "does not exist")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "index.json").write_text('{"format": "episodepipes-shards", "version": 1, "shards": [{}]}')
    _fails(capsys, ["verify", str(tmp_path / "bad")], "damaged", "shard 0 has no 'name'", "--overwrite")
    (src / "ep0002" / "front" / "000001.png").write_bytes(b"junk")
    _fails(capsys, ["write", str(src), str(tmp_path / "o"), "--workers", "2"], "'ep0002'", "000001.png", "--skip-bad")
    assert main(["write", str(src), str(tmp_path / "o"), "--workers", "2", "--skip-bad"]) == 0
    out = capsys.readouterr().out
    assert "wrote 2 episodes" in out and "skipped ep0002" in out and "000001.png" in out
    assert main(["info", str(tmp_path / "o")]) == 0 and "skipped   1\n  ep0002" in capsys.readouterr().out


class SlowReader(SyntheticReader):
    """Synthetic episodes that take a while to read, so a run can be killed mid-way."""

    delay: float = 0.0

    def read(self, episode_id):
        time.sleep(self.delay)
        return super().read(episode_id)


SLOW_KW = dict(num_episodes=16, length=10, height=64, width=80)
SCRIPT = f"""
import sys
sys.path.insert(0, {str(ROOT / 'tests')!r})
from test_cli import SLOW_KW, SlowReader
from episodepipes.sharding.cli import main
from episodepipes.sharding.readers import register_format

reader = SlowReader(**SLOW_KW)
object.__setattr__(reader, "delay", 0.08)
register_format("slow", lambda root: reader)
sys.exit(main(sys.argv[1:]))
"""


def test_sigkill_mid_run_then_rerun_is_byte_identical(tmp_path, monkeypatch):
    monkeypatch.setitem(FORMATS, "slow", Format("slow", lambda root: SlowReader(**SLOW_KW)))
    argv = ["write", str(tmp_path), "", "--format", "slow", "--shard-size", "40kB", "--workers", "2"]
    assert main([*argv[:2], str(tmp_path / "ref"), *argv[3:]]) == 0
    out = tmp_path / "out"
    cmd = [sys.executable, "-c", SCRIPT, *argv[:2], str(out), *argv[3:]]
    proc = subprocess.Popen(cmd, cwd=ROOT, start_new_session=True, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while not (out / "shard-000002.tar").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    os.killpg(proc.pid, signal.SIGKILL)  # the whole group: the writer and its encoder processes
    assert proc.wait() == -signal.SIGKILL, proc.stderr.read()
    assert not (out / "index.json").exists() and (out / "_progress.json").exists()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "resumed" in done.stdout, done.stderr
    assert _files(out) == _files(tmp_path / "ref")


def test_two_jobs_merged_by_the_cli_equal_one_job(tmp_path, capsys):
    src = write_raw(tmp_path / "src", SyntheticReader(num_episodes=5, length=4, height=32, width=40))
    common = ["--shard-size", "15kB", "--workers", "1", "--val-fraction", "0.4"]
    assert main(["write", str(src), str(tmp_path / "one"), *common]) == 0
    for i in (0, 1):
        assert main(["write", str(src), str(tmp_path / "two"), *common, "--num-jobs", "2", "--job-index", str(i)]) == 0
    assert "merge" in capsys.readouterr().out
    _fails(capsys, ["info", str(tmp_path / "two")], "unfinished write")
    assert main(["merge", str(tmp_path / "two")]) == 0
    assert _files(tmp_path / "two") == _files(tmp_path / "one")
    assert main(["verify", str(tmp_path / "two")]) == 0


@pytest.mark.parametrize("argv", [["--help"], ["write", "--help"]])
def test_help_documents_merge_equality(argv, capsys):
    with pytest.raises(SystemExit):
        main(argv)
    assert "byte-identical" in capsys.readouterr().out or argv[0] == "write"
