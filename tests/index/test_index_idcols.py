"""The id columns (`episodepipes.index.idcols`) from a stranger: each crafted file refused by name, in one line."""

import json
import shutil

import numpy as np
import pytest

from benchmarks import scale_index
from episodepipes.format import COLUMNS
from episodepipes.index import EpisodeIndex, IndexFormatError


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    return scale_index.make(tmp_path_factory.mktemp("ids") / "e", 40, length=2)


def _save(root, name, arr, *, declare=True):
    """Replace column ``name`` (and, with ``declare``, the dtype/shape the JSON declares for it)."""
    np.save(root / COLUMNS[name][0], arr)
    if declare:
        data = json.loads((root / "index.json").read_text())
        data["columns"][name].update(dtype=arr.dtype.str, shape=list(arr.shape))
        (root / "index.json").write_text(json.dumps(data))


def _ids(root):
    return np.load(root / COLUMNS["ids"][0])


def _order(root):
    return np.load(root / COLUMNS["id_order"][0])


CASES = {
    "duplicate id": (lambda r: _save(r, "ids", np.where(np.arange(40) == 7, _ids(r)[6], _ids(r))),
                     "episode 'ep0000006': this id appears twice"),
    "unsorted order": (lambda r: _save(r, "id_order", _order(r)[::-1].copy()), "it does not sort the ids"),
    "order out of range": (lambda r: _save(r, "id_order", np.where(_order(r) == 3, 40, _order(r))),
                           "column 'id_order': it should hold the episode numbers 0 to 39"),
    "order negative": (lambda r: _save(r, "id_order", np.where(_order(r) == 3, -1, _order(r))),
                       "column 'id_order': it should hold the episode numbers"),
    "order repeats": (lambda r: _save(r, "id_order", np.where(_order(r) == 3, 4, _order(r))),
                      "episode 3 is not in it"),
    "id escapes": (lambda r: _save(r, "ids", np.where(np.arange(40) == 5, b"../ep00", _ids(r)).astype("S9")),
                   "episode 5 (column 'ids'): id b'../ep00' is not a tar-safe episode id"),
    "id ends with a dot": (lambda r: _save(r, "ids", np.where(np.arange(40) == 9, b"ep000009.", _ids(r))),
                           "episode 9 (column 'ids')"),
    "NUL inside an id": (lambda r: _save(r, "ids", np.where(np.arange(40) == 2, b"ep\0x", _ids(r)).astype("S9")),
                         "episode 2 (column 'ids')"),
    "empty id": (lambda r: _save(r, "ids", np.where(np.arange(40) == 0, b"", _ids(r)).astype("S9")),
                 "episode 0 (column 'ids')"),
    "attr past attrs": (lambda r: _save(r, "attr", np.full(40, 99, "<u4")),
                        "episode 0 (column 'attr'): its code 99 is not below the 5 attrs"),
    "ids file cut short": (lambda r: (r / COLUMNS["ids"][0]).write_bytes((r / COLUMNS["ids"][0]).read_bytes()[:-9]),
                           "index.ids.npy holds"),
    "ids file another width": (lambda r: _save(r, "ids", _ids(r).astype("S12"), declare=False),
                               "index.ids.npy holds |S12 [40]"),
    "order file another dtype": (lambda r: _save(r, "id_order", _order(r).astype("<u4"), declare=False),
                                 "index.id_order.npy holds <u4 [40]"),
    "ids too few": (lambda r: _save(r, "ids", _ids(r)[:39]), "column 'ids': shape=[39]"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_crafted_id_column_is_refused_by_name_in_one_line(small, tmp_path, case):
    change, needle = CASES[case]
    copy = shutil.copytree(small, tmp_path / "c")
    change(copy)
    with pytest.raises(IndexFormatError) as e:
        EpisodeIndex.open(copy)
    msg = str(e.value)
    assert needle in msg and "\n" not in msg and ("index" in msg.split(":")[0]), msg


def test_ids_are_found_and_listed_from_the_columns(small):
    index = EpisodeIndex.open(small)
    assert "ids" not in index.meta and len(index.ids) == 40 and index.ids[39] == "ep0000039"
    assert index.ids[-1] == "ep0000039" and index.ids[:2] == ["ep0000000", "ep0000001"]
    assert "ep0000005" in index.ids and "ep5" not in index.ids and index.ids.index("ep0000012") == 12
    assert [e.id for e in index.episodes] == list(index.ids)
    assert index.tables.episode_meta[1] == {"robot": "ur5"} and len(index.tables.episode_meta) == 40
