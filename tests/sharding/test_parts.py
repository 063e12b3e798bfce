"""verify and stats --recompute split over K jobs (as a Slurm array runs them), their parts merged."""

import shutil

import pytest

from episodepipes.sharding.cli import main
from episodepipes.sharding.formats.synthetic import SyntheticReader
from episodepipes.sharding.write import WriteOptions, write_shards

SYN = SyntheticReader(num_episodes=7, length=4, height=16, width=16, lengths=(4, 2, 6, 3, 4, 5, 2))
OPTS = WriteOptions(format="synthetic", shard_size=4_000, val_fraction=0.3, seed=1)


@pytest.fixture
def out(tmp_path):
    write_shards(SYN, tmp_path / "o", OPTS)
    return tmp_path / "o"


def test_verify_in_three_parts_merges_to_ok_and_names_a_damaged_shard(out, capsys, monkeypatch):
    for i in range(3):
        assert main(["verify", str(out), "--num-jobs", "3", "--job-index", str(i)]) == 0
    assert main(["verify", str(out), "--num-jobs", "3", "--merge"]) == 0
    assert "ok (3 parts)" in capsys.readouterr().out and not (out / "_parts").exists()
    shard = sorted(out.glob("shard-*.tar"))[-1]
    blob = bytearray(shard.read_bytes())
    blob[600] ^= 0xFF
    shard.write_bytes(bytes(blob))
    monkeypatch.setenv("SLURM_ARRAY_TASK_COUNT", "3")  # the parts as a Slurm array's tasks 1..3 run them
    monkeypatch.setenv("SLURM_ARRAY_TASK_MIN", "1")
    monkeypatch.setenv("SLURM_ARRAY_TASK_MAX", "3")
    codes = []
    for task in (1, 2, 3):
        monkeypatch.setenv("SLURM_ARRAY_TASK_ID", str(task))
        codes.append(main(["verify", str(out), "--num-jobs", "3"]))
    assert codes == [0, 0, 1]  # the last block holds the last shard
    capsys.readouterr()
    assert main(["verify", str(out), "--num-jobs", "3", "--merge"]) == 1
    err = capsys.readouterr().err
    assert shard.name in err and "sha256" in err


def test_a_missing_or_stale_part_is_refused_by_name(out, capsys):
    assert main(["verify", str(out), "--num-jobs", "3", "--job-index", "0"]) == 0
    assert main(["verify", str(out), "--num-jobs", "3", "--merge"]) == 2
    assert "verify parts [1, 2] of 3 are missing" in capsys.readouterr().err
    for i in (1, 2):
        assert main(["verify", str(out), "--num-jobs", "3", "--job-index", str(i)]) == 0
    write_shards(SYN, out, WriteOptions(**{**OPTS.__dict__, "jpeg_quality": 50}), overwrite=True)  # another index
    capsys.readouterr()
    assert main(["verify", str(out), "--num-jobs", "3", "--merge"]) == 2
    assert "verify-0000-of-0003.json was made from another index.json" in capsys.readouterr().err


def test_stats_recompute_in_parts_equals_one_recompute_byte_for_byte(out, tmp_path):
    shutil.copytree(out, tmp_path / "whole")
    assert main(["stats", str(tmp_path / "whole"), "--recompute"]) == 0
    for i in (2, 0, 1):  # parts finish in any order
        assert main(["stats", str(out), "--recompute", "--num-jobs", "3", "--job-index", str(i)]) == 0
    assert main(["stats", str(out), "--recompute", "--num-jobs", "3", "--merge"]) == 0
    for name in ("index.json", "index.stats.bin"):
        assert (out / name).read_bytes() == (tmp_path / "whole" / name).read_bytes()
    assert not (out / "_parts").exists()


def test_split_stats_without_recompute_is_refused(out, capsys):
    assert main(["stats", str(out), "--num-jobs", "2", "--job-index", "0"]) == 2
    assert "--num-jobs splits stats --recompute only" in capsys.readouterr().err
