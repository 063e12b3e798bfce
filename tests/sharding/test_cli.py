import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import as_v1, write_raw

from episodepipes.index import EpisodeIndex
from episodepipes.sharding.cli import main
from episodepipes.sharding.episode import EpisodeError
from episodepipes.sharding.formats.readers import FORMATS, Format
from episodepipes.sharding.formats.synthetic import SyntheticReader

ROOT = Path(__file__).resolve().parents[2]
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
    data = json.loads((as_v1(out) / "index.json").read_text())  # offsets in the JSON, to move one
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
sys.path[:0] = [{str(ROOT / 'tests')!r}, {str(Path(__file__).resolve().parent)!r}]
from test_cli import SLOW_KW, SlowReader
from episodepipes.sharding.cli import main
from episodepipes.sharding.episode import EpisodeError
from episodepipes.sharding.formats.readers import register_format

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
    assert main(["merge", str(tmp_path / "two"), "--repack"]) == 0
    assert _files(tmp_path / "two") == _files(tmp_path / "one")
    assert main(["verify", str(tmp_path / "two")]) == 0


@pytest.mark.parametrize("argv", [["--help"], ["write", "--help"]])
def test_help_documents_merge_equality(argv, capsys):
    with pytest.raises(SystemExit):
        main(argv)
    assert "byte-identical" in capsys.readouterr().out or argv[0] == "write"


@dataclass(frozen=True)
class GateReader(SyntheticReader):
    """Reads episode 1 only once the file ``gate`` exists, so a test decides how long a write runs."""

    gate: str = ""

    def read(self, episode_id):
        while episode_id == "ep0001" and not os.path.exists(self.gate):
            time.sleep(0.01)
        return super().read(episode_id)


GATE_SCRIPT = f"""
import sys
sys.path[:0] = [{str(ROOT / 'tests')!r}, {str(Path(__file__).resolve().parent)!r}]
from test_cli import GateReader
from episodepipes.sharding.cli import main
from episodepipes.sharding.formats.readers import register_format

register_format("gate", lambda root: GateReader(num_episodes=3, length=4, height=16, width=16, gate=sys.argv[1]))
sys.exit(main(sys.argv[2:]))
"""


def test_a_second_writer_is_refused_naming_the_first_ones_pid(tmp_path, capsys):
    import socket

    out, gate = tmp_path / "out", tmp_path / "go"
    cmd = [sys.executable, "-c", GATE_SCRIPT, str(gate), "write", str(tmp_path), str(out), "--format", "gate",
           "--workers", "1"]
    first = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (out / "_write.lock").exists() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        second = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert first.poll() is None, first.stderr.read()
        assert second.returncode == 2 and second.stderr.count("\n") == 1, second.stderr
        assert f"being written by pid {first.pid} on host {socket.gethostname()}" in second.stderr
    finally:
        gate.touch()
    assert first.wait(timeout=120) == 0, first.stderr.read()
    assert not (out / "_write.lock").exists() and (out / "index.json").exists()
    # the refused writer took nothing away: the output is complete and verifies
    assert main(["verify", str(out)]) == 0


def test_a_stale_lock_is_taken_over_and_another_hosts_lock_is_refused(tmp_path, capsys, caplog, monkeypatch):
    import socket

    monkeypatch.setitem(FORMATS, "small", Format("small", lambda root: SMALL))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    out = tmp_path / "out"
    out.mkdir()
    (out / "_write.lock").write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname()}))
    assert main(["write", str(tmp_path), str(out), "--format", "small", "--workers", "1"]) == 0
    assert f"taking over the lock of pid {dead.pid}" in caplog.text and "no longer running" in caplog.text
    assert not (out / "_write.lock").exists()
    (out / "_write.lock").write_text(json.dumps({"pid": 1, "host": "elsewhere-node-7"}))
    _fails(capsys, ["write", str(tmp_path), str(out), "--format", "small", "--overwrite"],
           "pid 1 on host elsewhere-node-7", "delete the file")
    assert (out / "index.json").exists()  # --overwrite did not clear anything while refused


def test_out_is_a_file_and_bad_options_exit_2_with_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(FORMATS, "small", Format("small", lambda root: SMALL))
    (tmp_path / "file").write_text("keep me")
    base = ["write", str(tmp_path), str(tmp_path / "o"), "--format", "small"]
    _fails(capsys, ["write", str(tmp_path), str(tmp_path / "file"), "--format", "small"], "file is a file", "OUT")
    assert (tmp_path / "file").read_text() == "keep me"
    _fails(capsys, ["write", str(tmp_path / "file"), str(tmp_path / "o")], "is not a folder", "SRC")
    for flags, needle in ((["--num-jobs", "0"], "--num-jobs 0"), (["--num-jobs", "2", "--job-index", "2"],
                          "--job-index 2 must be within 0..1"), (["--job-index", "-1"], "--job-index -1"),
                          (["--seed", "-3"], "--seed -3"), (["--val-fraction", "nan"], "--val-fraction nan"),
                          (["--val-fraction", "1.5"], "--val-fraction 1.5"), (["--resize", "0x4"], "--resize"),
                          (["--shard-size=0.1"], "0.1"), (["--jpeg-quality", "0"], "--jpeg-quality"),
                          (["--workers", "0"], "--workers"), (["--format", "no_such_mod:make"], "no_such_mod"),
                          (["--format", "os:nope"], "has no 'nope'"), (["--format", "a b:c"], "module:factory"),
                          (["--format", "os.path:basename"], "is not an EpisodeReader"),
                          (["--format", "os:sep"], "is a str, not a Format or a callable"),
                          (["--resize", "70000x10"], "at most 65500 pixels"), (["--workers", "100000"], "--workers"),
                          (["--num-jobs", "4", "--job-index", "3"], "more than the 3 episodes")):
        _fails(capsys, [*base[:3], *flags] if "--format" in flags else [*base, *flags], needle)
    assert not (tmp_path / "o").exists()


class BadReader(SyntheticReader):
    def read(self, episode_id):
        raise EpisodeError(f"episode {episode_id!r}: unreadable\nsecond line of a library error")


def test_skip_bad_with_every_episode_bad_exits_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(FORMATS, "bad", Format("bad", lambda root: BadReader(num_episodes=3)))
    _fails(capsys, ["write", str(tmp_path), str(tmp_path / "o"), "--format", "bad", "--skip-bad", "--workers", "1"],
           "every episode of the source is bad (3 skipped", "'ep0000': unreadable second line", "no index")
    assert not (tmp_path / "o" / "index.json").exists()


def test_skipped_episodes_are_counted_in_the_summary(tmp_path, capsys):
    src = write_raw(tmp_path / "src", SMALL)
    (src / "ep0001" / "arrays.npz").write_bytes(b"junk")
    assert main(["write", str(src), str(tmp_path / "o"), "--workers", "1", "--skip-bad"]) == 0
    out = capsys.readouterr().out
    assert "wrote 2 episodes" in out and "skipped 1 bad episodes" in out and "skipped ep0001:" in out


def test_val_fraction_fills_only_episodes_without_a_split_and_the_summary_says_so(tmp_path, capsys):
    src = write_raw(tmp_path / "src", SyntheticReader(num_episodes=6, length=3, height=16, width=16))
    for eid in ("ep0000", "ep0001", "ep0003"):  # these have no split of their own
        meta = json.loads((src / eid / "meta.json").read_text())
        (src / eid / "meta.json").write_text(json.dumps({**meta, "split": None}))
    assert main(["write", str(src), str(tmp_path / "o"), "--workers", "1", "--val-fraction", "1"]) == 0
    out = capsys.readouterr().out
    assert "splits: 3 from the episodes' metadata, 3 from --val-fraction, 0 train by default" in out
    splits = {e.id: e.split for e in EpisodeIndex.open(tmp_path / "o").episodes}
    # metadata: ep0002 and ep0005 are val, ep0004 train; --val-fraction 1 puts the three others in val
    assert splits == {"ep0000": "val", "ep0001": "val", "ep0002": "val", "ep0003": "val", "ep0004": "train",
                      "ep0005": "val"}
    assert main(["write", str(src), str(tmp_path / "e"), "--workers", "1", "--val-episodes", "ep0000"]) == 0
    assert "3 from the episodes' metadata" not in capsys.readouterr().out
    splits = {e.id: e.split for e in EpisodeIndex.open(tmp_path / "e").episodes}
    assert [k for k, v in splits.items() if v == "val"] == ["ep0000"]  # an explicit list overrides metadata
    with pytest.raises(SystemExit):
        main(["write", "--help"])
    assert "split in meta.json" in " ".join(capsys.readouterr().out.split())


PROGRESS_SCRIPT = f"""
import sys
sys.path[:0] = [{str(ROOT / 'tests')!r}, {str(Path(__file__).resolve().parent)!r}]
from test_cli import SLOW_KW, SlowReader
from episodepipes.sharding.write import WriteOptions, write_shards
reader = SlowReader(**SLOW_KW)
object.__setattr__(reader, "delay", 0.05)
write_shards(reader, sys.argv[1], WriteOptions(format="slow"), progress_bar=True, progress_every=0.2)
"""


def test_progress_lines_when_stderr_is_a_pipe(tmp_path):
    res = subprocess.run([sys.executable, "-c", PROGRESS_SCRIPT, str(tmp_path / "o")], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    lines = [x for x in res.stderr.splitlines() if x.startswith("episodes ")]
    assert 2 <= len(lines) < 16, res.stderr  # >= 0.8 s of reading at one line per 0.2 s, not one per episode
    assert "\r" not in res.stderr  # no bar redraws in a log
    done = [int(x.split()[1].split("/")[0]) for x in lines]
    assert done == sorted(done) and all(x.split()[1].endswith("/16,") for x in lines)
    assert all(" frames/s, elapsed " in x and ", ETA " in x for x in lines)


def test_summary_has_wall_time_and_throughput(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(FORMATS, "small", Format("small", lambda root: SMALL))
    assert main(["write", str(tmp_path), str(tmp_path / "o"), "--format", "small", "--workers", "1"]) == 0
    line = capsys.readouterr().out.splitlines()[0]
    words = line.split(" in ")[1].split()
    assert float(words[0]) > 0 and words[1] == "s" and words[2].startswith("(") and words[3] == "frames/s"



# ---------------------------------------------------------------- issue 27, item 4: the CLI's smaller gaps

def _json_out(capsys, argv):
    assert main(argv) == 0
    text = capsys.readouterr().out
    data = json.loads(text)
    assert text == json.dumps(data, sort_keys=True, indent=2) + "\n"  # stable: sorted keys, one layout
    return text, data


def test_info_and_stats_json_are_sorted_plain_data_with_each_cameras_codec(tmp_path, capsys):
    src = write_raw(tmp_path / "src", SMALL)
    meta = json.loads((src / "ep0000" / "meta.json").read_text())
    (src / "ep0000" / "meta.json").write_text(json.dumps({**meta, "prompt": "red \x1b[31mstop\x9b é"}))
    out = tmp_path / "out"
    assert main(["write", str(src), str(out), "--workers", "1"]) == 0
    capsys.readouterr()
    text, info = _json_out(capsys, ["info", str(out), "--json", "--episodes"])
    assert text.isascii() and "\x1b" not in text  # JSON escapes the dataset's text itself
    assert info["output"] == str(out) and info["episodes"] == {"total": 3, "splits": {"train": 2, "val": 1}}
    assert info["frames"]["total"] == 18 and info["shards"] == len(EpisodeIndex.open(out).shards)
    assert info["cameras"] == [{"name": cam, "height": 32, "width": 40, "codec": "jpeg", "gop": 1, "copied": False,
                                "episodes": 3} for cam in ("front", "wrist")]
    assert info["episode_list"][0]["task"] == "red \x1b[31mstop\x9b é"  # the text as it is, not escaped twice
    assert main(["info", str(out)]) == 0 and "codecs    front jpeg (3 ep)" in capsys.readouterr().out
    _, stats = _json_out(capsys, ["stats", str(out), "--json"])
    index = EpisodeIndex.open(out)
    for split, key in index.stats_keys():
        s, got = index.stats(key, split=split), stats[split][key]
        assert got["count"] == s["count"] and got["shape"] == list(s["mean"].shape)
        assert got["q99"] == s["q99"].tolist() and set(got) == {"count", "shape", "mean", "std", "min", "max",
                                                                "q01", "q10", "q50", "q90", "q99"}
    h264 = tmp_path / "h264"
    assert main(["write", str(src), str(h264), "--workers", "1", "--codec", "h264", "--gop", "3"]) == 0
    capsys.readouterr()
    _, info = _json_out(capsys, ["info", str(h264), "--json"])
    assert [(c["codec"], c["gop"], c["copied"]) for c in info["cameras"]] == [("h264", 3, False)] * 2
    assert main(["info", str(h264)]) == 0 and "front h264 gop 3 (3 ep)" in capsys.readouterr().out


def test_every_positional_argument_has_help_text():
    import argparse

    from episodepipes.sharding.cli import _parser

    sub = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    bare = [f"{name} {a.metavar}" for name, p in sub.choices.items() for a in p._actions
            if not a.option_strings and not isinstance(a, argparse._SubParsersAction) and not a.help]
    assert bare == []


def test_output_into_a_closed_pipe_ends_quietly(tmp_path):
    out = tmp_path / "out"
    assert main(["write", str(write_raw(tmp_path / "src", SMALL)), str(out), "--workers", "1"]) == 0
    for argv in (["stats", str(out)], ["info", str(out), "--episodes"], ["info", str(out), "--json"]):
        read, write = os.pipe()
        os.close(read)  # the reader is gone before anything is printed, as `... | head -0` leaves it
        try:
            res = subprocess.run([sys.executable, "-m", "episodepipes.sharding.cli", *argv], cwd=ROOT, stdout=write,
                                 stderr=subprocess.PIPE, text=True, timeout=120)
        finally:
            os.close(write)
        assert res.returncode == 141 and res.stderr == "", (argv, res.returncode, res.stderr)


def test_a_source_folder_is_named_as_one_not_as_an_unfinished_write(tmp_path, capsys):
    src = write_raw(tmp_path / "src", SMALL)
    err = _fails(capsys, ["info", str(src)], f"no index.json in {src}", "holds no shards index",
                 f"episodepipes-shard write {src} OUT")
    assert "unfinished" not in err
    with pytest.raises(FileNotFoundError, match="holds no shards index"):
        EpisodeIndex.open(src)
    (src / "_progress.json").write_text("{}")  # a write's trace: the old advice stands
    _fails(capsys, ["info", str(src)], "an unfinished write: re-run the same write command")


def test_av1_writes_keep_the_encoders_info_lines_off_stderr(tmp_path):
    src = write_raw(tmp_path / "src", SMALL)
    env = {k: v for k, v in os.environ.items() if k != "SVT_LOG"}
    res = subprocess.run([sys.executable, "-m", "episodepipes.sharding.cli", "write", str(src), str(tmp_path / "o"),
                          "--workers", "1", "--codec", "av1"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr
    assert "Svt[" not in res.stderr and res.stderr.count("\n") <= 2, res.stderr
