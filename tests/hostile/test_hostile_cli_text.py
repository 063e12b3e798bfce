"""Text from a dataset (prompts, split names, attribute values) reaches the terminal only with its control
characters escaped, in every command's output: ``info`` (all forms), ``stats``, ``verify``, ``write``, ``upgrade``
and ``merge`` summaries. Run as a real process, reading its real stdout and stderr."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from helpers import write_raw

from episodepipes.sharding.formats.synthetic import SyntheticReader

HOSTILE = "go\x1b]0;pwned\x07 \x9b31m red\rX\x7f"
SPLIT = "val\x1b[2J\x9b"
RAW = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # C0 but \t and \n, DEL, C1


def _cli(*args: str) -> subprocess.CompletedProcess:
    """Run the CLI; its output decoded by hand (text mode's universal newlines would turn a raw \\r into \\n)."""
    got = subprocess.run([sys.executable, "-m", "episodepipes.sharding.cli", *args], capture_output=True, timeout=300)
    got.stdout, got.stderr = (b.decode("utf-8", "surrogateescape") for b in (got.stdout, got.stderr))
    return got


def _clean(text: str) -> str:
    found = RAW.findall(text)
    assert not found, f"raw control characters {found!r} reached the terminal in: {text!r}"
    return text


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    """A dataset whose episodes carry hostile prompts and attribute values (in their meta.json, as written) and a
    hostile split name (the writer takes only train and val, so it is edited into index.json, as anyone can)."""
    d = tmp_path_factory.mktemp("hostile_text")
    src = write_raw(d / "src", SyntheticReader(num_episodes=2, length=3, height=16, width=24))
    for k, ep in enumerate(sorted((d / "src").iterdir())):
        meta = json.loads((ep / "meta.json").read_text())
        meta.update(prompt=HOSTILE, robot=HOSTILE, note="\x9b2J", split=("train", "val")[k])
        (ep / "meta.json").write_text(json.dumps(meta))
    got = _cli("write", str(src), str(d / "out"), "--workers", "1")
    assert got.returncode == 0, got.stderr
    index = json.loads((d / "out" / "index.json").read_text())
    index["splits"] = [SPLIT if s == "val" else s for s in index["splits"]]
    (d / "out" / "index.json").write_text(json.dumps(index))
    got = _cli("stats", str(d / "out"), "--recompute")  # under the new split name
    assert got.returncode == 0, got.stderr
    return d / "out"


def test_info_episodes_escapes_prompts_splits_and_attributes(out):
    got = _cli("info", str(out), "--episodes")
    assert got.returncode == 0, got.stderr
    text = _clean(got.stdout)
    assert r"go\x1b]0;pwned\x07 \x9b31m red\rX\x7f" in text  # the prompt (and the robot= value), shown escaped
    assert r"val\x1b[2J\x9b" in text  # the split, in the summary and on its episode's row
    assert r"\x9b2J" in text
    assert len(text.strip().splitlines()) == 11 + 1 + 2  # the summary (codecs included), a header, one line per episode


def test_info_summary_escapes_split_names(out):
    text = _clean(_cli("info", str(out)).stdout)
    assert r"val\x1b[2J\x9b 1" in text


@pytest.mark.parametrize("recompute", [False, True])
def test_stats_escapes_split_names(out, recompute):
    got = _cli("stats", str(out), *(["--recompute"] if recompute else []))
    assert got.returncode == 0, got.stderr
    assert r"val\x1b[2J\x9b/action  count=3" in _clean(got.stdout)


def test_write_and_upgrade_summaries_escape_what_they_quote(tmp_path):
    """A skipped episode's error quotes its metadata; the write summary prints it."""
    src = write_raw(tmp_path / "src", SyntheticReader(num_episodes=2, length=3, height=16, width=24))
    bad = sorted(src.iterdir())[1]
    (bad / "meta.json").write_text(json.dumps({"fps": 10, "prompt": "p", "split": HOSTILE}))
    got = _cli("write", str(src), str(tmp_path / "out"), "--workers", "1", "--skip-bad")
    assert got.returncode == 0, got.stderr
    assert "skipped 1 bad episodes" in _clean(got.stdout + got.stderr)
    got = _cli("info", str(tmp_path / "out"))
    assert r"go\x1b]0;pwned\x07 \x9b31m" in _clean(got.stdout)  # the skipped episode's error, in the summary


def test_verify_prints_nothing_raw(out):
    got = _cli("verify", str(out))
    assert got.returncode == 0, got.stderr
    _clean(got.stdout + got.stderr)


def test_a_warning_quoting_a_lock_files_holder_is_escaped(out, tmp_path):
    """``_write.lock`` is a file in the dataset folder: the take-over warning quotes its pid field."""
    import shutil
    import socket

    copy = shutil.copytree(out, tmp_path / "copy")
    (copy / "_write.lock").write_text(json.dumps({"pid": HOSTILE, "host": socket.gethostname()}))
    got = _cli("stats", str(copy), "--recompute")
    assert got.returncode == 0, got.stderr
    assert r"taking over the lock of pid go\x1b]0;pwned\x07" in _clean(got.stderr)
