"""Names that only look like the writer's: ``\\d`` in a Python pattern takes any Unicode digit, so
``shard-０００００１.tar`` (fullwidth digits) passed for a shard name. An index naming one is refused,
and a resumed write leaves such a file in OUT alone (it deleted it as a shard of its own finished after
the interruption). Frame files numbered in other digits, and names carrying terminal control characters."""

from __future__ import annotations

import json
import shutil

import pytest
from helpers import make_shards

from episodepipes.index import EpisodeIndex, IndexFormatError
from episodepipes.sharding.write.progress import start

FULLWIDTH = "shard-" + "".join(chr(0xFF10 + int(c)) for c in "000000") + ".tar"  # looks like shard-000000.tar


def test_a_shard_name_in_other_digits_is_refused_by_name(tmp_path):
    out = make_shards(tmp_path / "s", num_episodes=2, length=3, height=16, width=24)
    d = json.loads((out / "index.json").read_text())
    shutil.move(out / d["shards"][0]["name"], out / FULLWIDTH)
    d["shards"][0]["name"] = FULLWIDTH
    (out / "index.json").write_text(json.dumps(d))
    with pytest.raises(IndexFormatError) as e:  # it opened, and read that file
        EpisodeIndex.open(out)
    assert "name=" in str(e.value) and "shard-000000.tar" in str(e.value) and "\n" not in str(e.value)


def test_a_resumed_write_leaves_a_file_named_in_other_digits_alone(tmp_path):
    out = tmp_path / "out"
    start(out, {"a": 1}, overwrite=False)  # an unfinished write with no shard finished yet
    theirs = out / FULLWIDTH.replace("\uff10.tar", "\uff11.tar")
    theirs.write_bytes(b"not ours")
    ours = out / "shard-000001.tar"  # a shard finished after the last recorded progress: rewritten on resume
    ours.write_bytes(b"x")
    _, resumed = start(out, {"a": 1}, overwrite=False)
    assert resumed and not ours.exists()
    assert theirs.read_bytes() == b"not ours"  # it was deleted


def test_a_raw_frame_named_in_other_digits_is_ordered_by_name(tmp_path):
    """``'²'.isdigit()`` is True and ``int('²')`` a ValueError naming no file: ordering the frames failed."""
    import numpy as np
    from helpers import write_raw

    from episodepipes.sharding.formats.raw import RawReader
    from episodepipes.sharding.formats.synthetic import SyntheticReader

    src = write_raw(tmp_path / "src", SyntheticReader(num_episodes=1, length=3, height=16, width=24))
    eid = RawReader(src).episode_ids()[0]
    want = {c: [f.copy() for f in frames] for c, frames in RawReader(src).read(eid).cameras.items()}
    for cam in want:
        (src / eid / cam / "000002.png").rename(src / eid / cam / "\u00b2.png")  # after the numbered frames
    got = RawReader(src).read(eid).cameras
    for cam, frames in want.items():
        assert all(np.array_equal(a, b) for a, b in zip(frames, got[cam], strict=True))


def test_the_cli_prints_an_error_naming_a_path_with_control_characters_escaped(tmp_path, capsys):
    """A dataset folder named by its provider (here ESC ] 0 ; ... BEL, which retitles the terminal, and a right-to-left
    override) is quoted by the error; the CLI printed it as it was."""
    from episodepipes.sharding.cli import main

    src = tmp_path / "data\x1b]0;owned\x07\u202eset"
    src.mkdir()
    assert main(["info", str(src)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and all(c.isprintable() for c in err.rstrip("\n")), repr(err)
    assert "data\\x1b]0;owned\\x07\\u202eset" in err
