"""Hostile output folders: a name a command writes to is already a symlink (to a file outside the dataset), a FIFO
or a folder. A v1 dataset received as a tarball is exactly what ``upgrade`` runs on, so every file the sharding
commands create or replace in a dataset or output folder is refused by name instead of followed, and the file the
link points at is never written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers import as_v1, make_shards, put_fifo, put_folder

from episodepipes.safefile import UnsafePathError
from episodepipes.sharding.cli import main
from episodepipes.sharding.formats.synthetic import SyntheticReader
from episodepipes.sharding.write import WriteOptions, write_shards

SECRET = b"outside the dataset: must never be written\n"
SYN = SyntheticReader(num_episodes=4, length=6, height=16, width=16)


def _outside(tmp_path: Path) -> Path:
    target = tmp_path / "victim.txt"
    target.write_bytes(SECRET)
    return target


def _plant(folder: Path, name: str, target: Path) -> Path:
    link = folder / name
    link.symlink_to(target)
    return link


def _v1(tmp_path: Path) -> Path:
    return as_v1(make_shards(tmp_path / "ds", num_episodes=3, length=6, height=16, width=16))


def _refused(argv: list[str], link: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(argv) == 2
    err = _errors(capsys.readouterr().err)
    assert len(err) == 1 and f"{link} is a symlink" in err[0], err


def _errors(stderr: str) -> list[str]:
    """The error lines of the CLI's stderr (a v1 index also logs a warning that it is slow to open)."""
    return [line for line in stderr.splitlines() if not line.startswith("WARNING: ")]


@pytest.mark.parametrize("name", ["_write.lock", "index.json.tmp", "index.episodes.npy.tmp",
                                  "index.segments.npy.tmp", "index.offset.npy.tmp"])
def test_upgrade_refuses_a_planted_link_and_writes_nothing_outside(tmp_path, capsys, name):
    ds, victim = _v1(tmp_path), _outside(tmp_path)
    link = _plant(ds, name, victim)
    _refused(["upgrade", str(ds)], link, capsys)
    assert victim.read_bytes() == SECRET and link.is_symlink()
    assert [p.name for p in ds.glob("*.tmp")] == ([name] if name.endswith(".tmp") else [])  # no temp file left
    assert (ds / "index.json").read_bytes().startswith(b'{"episodes"')  # still the v1 index


@pytest.mark.parametrize("name", ["_write.lock", "index.json.tmp", "index.stats.bin.tmp"])
def test_stats_recompute_refuses_a_planted_link_and_writes_nothing_outside(tmp_path, capsys, name):
    ds, victim = _v1(tmp_path), _outside(tmp_path)
    link = _plant(ds, name, victim)
    _refused(["stats", str(ds), "--recompute"], link, capsys)
    assert victim.read_bytes() == SECRET and link.is_symlink()


@pytest.mark.parametrize("name", ["_write.lock", "index.json.tmp"])
def test_a_fifo_where_upgrade_writes_is_refused_instead_of_hanging(tmp_path, name):
    ds = _v1(tmp_path)
    put_fifo(ds / name)
    res = subprocess.run([sys.executable, "-m", "episodepipes.sharding.cli", "upgrade", str(ds)], capture_output=True,
                         text=True, timeout=60)  # the old code waited forever to open index.json.tmp for writing
    err = _errors(res.stderr)
    assert res.returncode == 2 and len(err) == 1 and f"{ds / name} is a FIFO" in err[0], res.stderr


def test_a_fifo_as_the_statistics_log_is_refused_instead_of_hanging(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    put_fifo(out / "_progress.stats.log")
    script = ("import sys\n"
              "from episodepipes.sharding.formats.synthetic import SyntheticReader\n"
              "from episodepipes.sharding.write import WriteOptions, write_shards\n"
              "write_shards(SyntheticReader(num_episodes=4, length=6, height=16, width=16), sys.argv[1],\n"
              "             WriteOptions(format='synthetic', shard_size=4096))\n")
    res = subprocess.run([sys.executable, "-c", script, str(out)], capture_output=True, text=True,
                         timeout=60)  # the old code waited forever to open the log for appending
    assert res.returncode == 1 and f"UnsafePathError: {out / '_progress.stats.log'} is a FIFO" in res.stderr


def test_a_folder_as_a_temp_name_is_refused_by_name(tmp_path, capsys):
    ds = _v1(tmp_path)
    put_folder(ds / "index.json.tmp")
    assert main(["upgrade", str(ds)]) == 2
    assert f"{ds / 'index.json.tmp'} is a folder" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["shard-000000.tar.tmp", "_progress.json.tmp", "_progress.stats.log",
                                  "index.stats.bin.tmp", "index.crc32.npy.tmp"])
def test_write_refuses_a_planted_link_in_out(tmp_path, name):
    out, victim = tmp_path / "out", _outside(tmp_path)
    out.mkdir()
    link = _plant(out, name, victim)
    with pytest.raises(UnsafePathError, match=f"{link} is a symlink"):
        write_shards(SYN, out, WriteOptions(format="synthetic", shard_size=4096))
    assert victim.read_bytes() == SECRET and link.is_symlink()


@pytest.mark.parametrize("folder", ["_jobs", "_jobs/job-0001"])
def test_a_job_writes_into_no_planted_folder_link(tmp_path, folder):
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    elsewhere.mkdir()
    (out / folder).parent.mkdir(parents=True)
    link = _plant(out, folder, elsewhere)
    with pytest.raises(UnsafePathError, match=f"{link} is a symlink"):
        write_shards(SYN, out, WriteOptions(format="synthetic", shard_size=4096), num_jobs=2, job_index=1)
    assert list(elsewhere.iterdir()) == []


def test_the_spool_of_a_pooled_write_is_no_planted_link(tmp_path):
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    elsewhere.mkdir()
    out.mkdir()
    link = _plant(out, "_spool", elsewhere)
    with pytest.raises(UnsafePathError, match=f"{link} is a symlink"):
        write_shards(SYN, out, WriteOptions(format="synthetic", shard_size=4096), workers=2)
    assert list(elsewhere.iterdir()) == []


def test_merge_refuses_a_planted_column_temp_link(tmp_path, capsys):
    out, victim = tmp_path / "out", _outside(tmp_path)
    for j in range(2):
        write_shards(SYN, out, WriteOptions(format="synthetic", shard_size=4096), num_jobs=2, job_index=j)
    link = _plant(out, "index.crc32.npy.tmp", victim)
    _refused(["merge", str(out)], link, capsys)
    assert victim.read_bytes() == SECRET and (out / "_jobs").is_dir()  # the jobs stay for a re-run


def test_rank_logs_follow_no_planted_link(tmp_path):
    from episodepipes.lightning_glue.launch import run_ranks

    logs, victim = tmp_path / "logs", _outside(tmp_path)
    logs.mkdir()
    link = _plant(logs, "rank0.log", victim)
    with pytest.raises(UnsafePathError, match=f"{link} is a symlink"):
        run_ranks([sys.executable, "-c", "print('rank output')"], nprocs=1, log_dir=logs, timeout=60)
    assert victim.read_bytes() == SECRET
