"""The CLI's one-line errors for a remote OUT or root: a bucket that does not exist (against moto's real S3
server), and the ``remote`` extra not installed."""

import sys

import pytest
from helpers import write_raw

from episodepipes.index import EpisodeIndex
from episodepipes.sharding.cli import main
from episodepipes.sharding.formats.synthetic import SyntheticReader

SMALL = SyntheticReader(num_episodes=2, length=3, height=16, width=16)


def _one_line(capsys, argv, *needles):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("episodepipes-shard: error:") and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, (needle, err)
    return err


def test_a_write_to_a_missing_bucket_says_so_in_one_line(proxy, tmp_path, capsys):
    src = write_raw(tmp_path / "src", SMALL)
    err = _one_line(capsys, ["write", str(src), "s3://no-such-bucket/out", "--workers", "1", "--staging",
                             str(tmp_path / "stage")],
                    "s3://no-such-bucket/out", "bucket 'no-such-bucket' does not exist", "create it")
    assert "<?xml" not in err and "\\n" not in err and len(err) < 400, err


def test_a_missing_remote_extra_is_an_import_error_naming_the_install(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "obstore", None)  # as if the extra were not installed: find_spec gives None
    with pytest.raises(ImportError, match=r"pip install 'episodepipes\[remote\]'"):
        EpisodeIndex.open("s3://bucket/prefix")
    _one_line(capsys, ["info", "s3://bucket/prefix"], "needs obstore", "pip install 'episodepipes[remote]'")
