"""Hostile episode attributes on their way to ``where=``: names in two Unicode spellings or with control characters,
JSON tokens that are not numbers, integers of thousands of digits, and values of odd types. The writer and the
index refuse the same names in one line naming the episode and the attribute; what they keep reaches ``where=``
with its JSON type (a bool is not an int, 1.0 is not 1)."""

import json
import re
import shutil

import numpy as np
import pytest
from helpers import write_raw

from episodepipes.index import EpisodeIndex
from episodepipes.index.check import IndexFormatError
from episodepipes.pipes.select import attributes, select
from episodepipes.sharding.cli import main
from episodepipes.sharding.formats.synthetic import SyntheticReader

READER = SyntheticReader(num_episodes=3, length=4, height=16, width=24)
NFD = "cafe\u0301"  # "café" decomposed: looks like the NFC "caf\u00e9", compares unequal


def _raw(src, extra):
    write_raw(src, READER)
    for eid in READER.episode_ids():
        f = src / eid / "meta.json"
        f.write_text(json.dumps({**json.loads(f.read_text()), **extra}))
    return src


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile_attrs")
    out = root / "out"
    assert main(["write", str(_raw(root / "src", {"flag": True, "n": 1, "x": 1.0, "caf\u00e9": "ok"})), str(out),
                 "--workers", "1"]) == 0
    return out


def _index_with(written, tmp_path, text_edit):
    copy = tmp_path / "h"
    shutil.copytree(written, copy)
    raw = (copy / "index.json").read_text()
    (copy / "index.json").write_text(text_edit(raw))
    return copy


@pytest.mark.parametrize("name", [NFD, "robot\x00", "tab\tname", "line\nbreak"])
def test_an_attribute_name_in_another_spelling_or_with_control_characters_is_refused_by_the_writer(tmp_path, capsys,
                                                                                                 name):
    src = _raw(tmp_path / "src", {name: 1})
    assert main(["write", str(src), str(tmp_path / "out"), "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and "episode 'ep0000'" in err, err
    assert f"attribute name {ascii(name)} should be NFC-normalised text without control characters" in err
    assert not (tmp_path / "out" / "index.json").exists()


@pytest.mark.parametrize("name", [NFD, "robot\x00"])
def test_an_index_attribute_name_in_another_spelling_is_refused_at_open(written, tmp_path, name):
    data = json.loads((written / "index.json").read_text())
    data["attrs"][int(np.load(written / "index.attr.npy")[1])][name] = "franka"  # episode 1's attribute set
    copy = _index_with(written, tmp_path, lambda raw: json.dumps(data))
    with pytest.raises(IndexFormatError, match=r"index.json is damaged: episode 'ep000[01]': episode_meta attribute "
                                               rf"name {re.escape(ascii(name))} should be NFC-normalised") as e:
        EpisodeIndex.open(copy)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(("token", "needle"), [
    ("NaN", "attribute 'n'=nan is not a finite number"),
    ("-Infinity", "attribute 'n'=-inf is not a finite number"),
    ("1e400", "attribute 'n'=inf is not a finite number"),
    ("9" * 20, "attribute 'n' is an integer outside the int64 range"),
])
def test_json_tokens_that_are_no_int64_or_finite_number_are_refused_by_name(written, tmp_path, token, needle):
    copy = _index_with(written, tmp_path, lambda raw: raw.replace('"n":1', f'"n":{token}', 1))
    with pytest.raises(IndexFormatError, match=rf"damaged: episode 'ep0000': episode_meta {needle}"):
        EpisodeIndex.open(copy)


def test_an_integer_of_thousands_of_digits_is_refused_as_json_naming_the_file(written, tmp_path):
    copy = _index_with(written, tmp_path, lambda raw: raw.replace('"n":1', f'"n":{"9" * 5000}', 1))
    with pytest.raises(IndexFormatError, match=rf"^{copy / 'index.json'}: not valid JSON \(.*digits.*\); re-shard"):
        EpisodeIndex.open(copy)


def test_where_sees_each_attribute_with_its_json_type(written):
    index = EpisodeIndex.open(written)
    seen = attributes(index.episodes[0])
    assert {k: (type(v), v) for k, v in seen.items() if k in ("flag", "n", "x", "caf\u00e9")} == {
        "flag": (bool, True), "n": (int, 1), "x": (float, 1.0), "caf\u00e9": (str, "ok")}
    assert len(select(index, None, where=lambda a: a["flag"] is True and type(a["n"]) is int)) == 3
    assert NFD not in seen  # the other spelling selects nothing, and the writer never lets it in


def test_where_cannot_change_what_the_next_episode_sees(written):
    index = EpisodeIndex.open(written)

    def meddle(a):
        a["flag"] = False
        a.pop("n")
        return True

    select(index, None, where=meddle)
    assert all(e.meta["flag"] is True and e.meta["n"] == 1 for e in index.episodes)


def test_episode_folders_whose_names_become_one_tar_safe_id_are_refused_before_writing(tmp_path, capsys):
    """"caf\u00e9" and "caf\u00e8" (or a name and its other Unicode spelling) would share member names."""
    src = _raw(tmp_path / "src", {})
    (src / "ep0000").rename(src / "caf\u00e9")
    (src / "ep0001").rename(src / "caf\u00e8")
    assert main(["write", str(src), str(tmp_path / "out"), "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "both become 'caf_' in shard member names; rename one of them" in err, err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").glob("shard-*"))
