"""Index format v2: same content as v1, columns checked by name, upgrade in place, v1 still opens."""

import json
import logging
import shutil

import numpy as np
import pytest
from helpers import as_v1

from episodepipes.format import COLUMNS, PACKED_COLUMNS
from episodepipes.index import EpisodeIndex, IndexFormatError
from episodepipes.sharding.cli import main
from episodepipes.sharding.formats.synthetic import SyntheticReader
from episodepipes.sharding.upgrade import upgrade
from episodepipes.sharding.write.encode import EncodeOptions, encode_episode
from episodepipes.sharding.write.writer import ShardWriter


def _write(out, version, *, robot=True):
    """Five episodes over several shards; episode 1 carries extra attributes, as a custom reader may give."""
    reader = SyntheticReader(num_episodes=5, length=9, height=24, width=32)
    with ShardWriter(out, shard_size=30_000, options={"jpeg_quality": 90}, version=version,
                     extra={"skipped": [{"id": "ep9", "error": "bad"}]}) as w:
        for eid in reader.episode_ids():
            enc = encode_episode(reader.read(eid), EncodeOptions())
            meta = dict(enc.meta, robot_type="aloha", scene_table=2) if robot and eid == "ep0001" else enc.meta
            w.add_frames(meta, enc.data(), enc.sizes)
    return out


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("pair")
    return _write(root / "v1", 1), _write(root / "v2", 2)


def _files(root):
    return {p.name: p.read_bytes() for p in sorted(root.iterdir()) if p.name.startswith("index")}


def test_v2_holds_every_field_v1_holds(pair):
    v1, v2 = (EpisodeIndex.open(p) for p in pair)
    assert (v1.version, v2.version) == (1, 2)
    assert sorted(p.name for p in pair[1].iterdir() if p.suffix == ".npy") == sorted(
        f for k, (f, _, _) in COLUMNS.items() if k not in PACKED_COLUMNS)  # a JPEG shard is in the members layout
    assert len(v2.shards) > 2 and v1.shards == v2.shards and v1.options == v2.options
    assert list(v1.episodes) == list(v2.episodes)  # id, split, length, fps, prompt, cameras, arrays, segments, meta
    assert any(len(e.segments) > 1 for e in v2.episodes) and all(s.crc32 for e in v2.episodes for s in e.segments)
    assert v2.episode("ep0001").meta == {"robot_type": "aloha", "scene_table": 2}
    assert v2.data == json.loads((pair[0] / "index.json").read_text())  # the v1 layout, rebuilt from the columns
    assert v2.frames == 45 and v2.has_crc and v2.meta["skipped"] == [{"id": "ep9", "error": "bad"}]
    for a, b in zip(v1.episodes, v2.episodes):
        for f in range(a.length):
            assert a.frame_range(f) == b.frame_range(f) and a.frame_crc(f) == b.frame_crc(f)
        assert a.nbytes == b.nbytes
    v2.verify()


def test_vectorised_accessors_equal_the_per_frame_ones(pair):
    index = EpisodeIndex.open(pair[1])
    rows = np.concatenate([np.array(e.rows) for e in index.episodes])[::-1]
    shard, start, end = index.frame_ranges(rows)
    want = [index.episodes[n].frame_range(f) for n in reversed(range(5)) for f in reversed(range(9))]
    assert list(zip(shard.tolist(), start.tolist(), end.tolist())) == want
    assert index.frame_crcs(rows).tolist() == [index.episodes[r // 9].frame_crc(r % 9) for r in rows.tolist()]
    assert [e.id for e in index.split("val")] == [index.ids[n] for n in index.split_numbers("val")]
    assert index.lengths.tolist() == [9] * 5 and index.split_numbers("nope").size == 0


def test_the_same_input_gives_byte_identical_index_files(pair, tmp_path):
    assert _files(_write(tmp_path / "again", 2)) == _files(pair[1])


def test_upgrade_reads_no_shard_and_gives_the_bytes_a_v2_write_gives(pair, tmp_path):
    copy = shutil.copytree(pair[0], tmp_path / "c")
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    for p in copy.glob("shard-*.tar"):
        p.rename(hidden / p.name)  # the upgrade must not need them
    assert main(["upgrade", str(copy)]) == 0
    assert _files(copy) == _files(pair[1])
    for p in hidden.iterdir():
        p.rename(copy / p.name)
    assert list(EpisodeIndex.open(copy, verify=True).episodes) == list(EpisodeIndex.open(pair[0]).episodes)


def _without_crcs(root):
    data = json.loads((root / "index.json").read_text())
    for e in data["episodes"]:
        for s in e["segments"]:
            del s["crc32"]
    (root / "index.json").write_text(json.dumps(data))
    return root


def test_upgrade_of_an_index_without_crcs_says_so_and_upgrade_crc_adds_them(pair, tmp_path, capsys):
    copy = _without_crcs(shutil.copytree(pair[0], tmp_path / "c"))
    old = list(EpisodeIndex.open(copy).episodes)
    assert main(["upgrade", str(copy)]) == 0 and "no crc32" in capsys.readouterr().out
    index = EpisodeIndex.open(copy)
    assert index.version == 2 and not index.has_crc and index.meta["crc32"] is False
    assert list(index.episodes) == old and index.episodes[0].frame_crc(0) is None
    assert not (copy / COLUMNS["crc32"][0]).exists()
    main(["info", str(copy)])
    assert "no per-frame crc32" in capsys.readouterr().out
    assert main(["upgrade", str(copy), "--crc"]) == 0
    assert _files(copy) == _files(pair[1])  # the crc32 read from the shards are the writer's
    assert main(["upgrade", str(copy)]) == 2 and "already version 2" in capsys.readouterr().err


def test_upgrade_crc_refuses_a_shard_that_changed(pair, tmp_path, capsys):
    copy = _without_crcs(shutil.copytree(pair[0], tmp_path / "c"))
    shard = copy / "shard-000001.tar"
    blob = bytearray(shard.read_bytes())
    blob[900] ^= 1
    shard.write_bytes(bytes(blob))
    assert main(["upgrade", str(copy), "--crc"]) == 2
    assert "shard-000001.tar does not match the index" in capsys.readouterr().err
    assert EpisodeIndex.open(copy).version == 1  # nothing was rewritten


def test_a_v1_index_opens_and_logs_one_line_with_the_upgrade_command(pair, tmp_path, caplog):
    copy = shutil.copytree(pair[0], tmp_path / "c")
    with caplog.at_level(logging.WARNING, logger="episodepipes.index"):
        for _ in range(3):
            EpisodeIndex.open(copy)
        EpisodeIndex.open(pair[1])
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "version 1" in lines[0] and f"episodepipes-shard upgrade {copy}" in lines[0]


def test_info_lists_episodes_and_frames_and_bytes_per_split(pair, capsys):
    assert main(["info", str(pair[1]), "--episodes"]) == 0
    out = capsys.readouterr().out
    index = EpisodeIndex.open(pair[1])
    val = [e for e in index.episodes if e.split == "val"]
    assert f"frames    45 (train {45 - 9 * len(val)}, val {9 * len(val)})" in out
    assert f"val {sum(e.nbytes for e in val)}" in out and "version 2, crc32 per frame" in out
    attrs = 'robot_type="aloha" scene_table=2'  # ep0001's attributes; the others have none ("-")
    assert f"id      split  length  {'attributes':<{len(attrs)}}  task" in out
    for e in index.episodes:
        shown = attrs if e.id == "ep0001" else "-"
        assert f"{e.id}  {e.split:<5}  {e.length}       {shown:<{len(attrs)}}  {e.prompt}" in out


def _save(root, name, arr, **kw):
    np.save(root / COLUMNS[name][0], arr, **kw)


COLUMN_CASES = {
    "wrong dtype": ("offset", lambda a: a.astype("<u4"), "holds <u4"),
    "big endian": ("size", lambda a: a.astype(">u4"), "holds >u4"),
    "too short": ("offset", lambda a: a[:-1], "[44]"),
    "wrong shape": ("episodes", lambda a: a[:, :6], "[5, 6]"),
    "pickle": ("crc32", lambda a: np.array([{"x": 1}] * len(a), dtype=object), "not a <u4 column"),
}


@pytest.mark.parametrize("case", sorted(COLUMN_CASES))
def test_a_hostile_column_is_refused_at_open_naming_the_file(pair, tmp_path, case):
    name, change, needle = COLUMN_CASES[case]
    copy = shutil.copytree(pair[1], tmp_path / "c")
    _save(copy, name, change(np.load(copy / COLUMNS[name][0])), allow_pickle=True)
    with pytest.raises(IndexFormatError) as e:
        EpisodeIndex.open(copy)
    msg = str(e.value)
    assert str(copy / COLUMNS[name][0]) in msg and needle in msg and "\n" not in msg, msg


@pytest.mark.parametrize("damage, needle", [
    (lambda p: p.write_bytes(b"not numpy at all"), "not a <u8 column"),
    (lambda p: p.write_bytes(p.read_bytes()[:-8]), "not a <u8 column"),
    (lambda p: p.write_bytes(p.read_bytes() + b"\0" * 8), "holds 496 bytes"),
    (lambda p: p.unlink(), "is missing"),
])
def test_a_column_that_is_not_the_array_the_index_says_is_refused(pair, tmp_path, damage, needle):
    copy = shutil.copytree(pair[1], tmp_path / "c")
    damage(copy / COLUMNS["offset"][0])
    with pytest.raises(IndexFormatError, match=needle):
        EpisodeIndex.open(copy)


def test_offsets_that_go_backwards_are_refused_at_first_use_and_by_verify(pair, tmp_path):
    copy = shutil.copytree(pair[1], tmp_path / "c")
    off = np.load(copy / COLUMNS["offset"][0])
    off[12] = off[11]  # episode 1's frame 3 now overlaps frame 2
    _save(copy, "offset", off)
    index = EpisodeIndex.open(copy)  # per-frame values are not read at open
    assert index.episodes[0].frame_range(8)[1] == int(off[8])
    with pytest.raises(IndexFormatError, match=r"episode 'ep0001' segment \d: frame \d+ of the segment starts"):
        index.episodes[1].frame_range(0)
    problems = index.problems()
    assert any("index.offset.npy: sha256 mismatch" in p for p in problems)
    assert any("episode 'ep0001'" in p for p in problems)


def test_an_offset_past_the_shard_is_refused(pair, tmp_path):
    copy = shutil.copytree(pair[1], tmp_path / "c")
    size = np.load(copy / COLUMNS["size"][0])
    size[44] = 2**31
    _save(copy, "size", size)
    with pytest.raises(IndexFormatError, match=r"episode 'ep0004' .*after the shard's"):
        EpisodeIndex.open(copy).frame_ranges(np.arange(40, 45))


def _json(d, key, value):
    d[key] = value


JSON_CASES = {
    "unknown layout": (lambda d: _json(d, "layout", "packed-v9"), "layout='packed-v9'"),
    "crc32 not a bool": (lambda d: _json(d, "crc32", 1), "crc32=1"),
    "attrs not a list": (lambda d: _json(d, "attrs", {}), "attrs"),
    "attrs and ids": (lambda d: _json(d, "ids", ["a"]), "both ids and attrs"),
    "too many attrs": (lambda d: _json(d, "attrs", [{}] * 7), "attrs lists 7 attribute sets"),
    "attrs override the id": (lambda d: d["attrs"].append({"id": "x"}), "built-in episode field"),
    "ids dtype": (lambda d: d["columns"]["ids"].update(dtype="<U6"), "dtype '|S'<width"),
    "ids too wide": (lambda d: d["columns"]["ids"].update(dtype="|S5000"), "dtype '|S'<width"),
    "episode_meta without ids": (lambda d: _json(d, "episode_meta", []), "episode_meta is listed but ids are not"),
    "fps zero": (lambda d: _json(d, "fps", [0]), "fps=0"),
    "split not a str": (lambda d: _json(d, "splits", [1, 2]), "splits should hold strings"),
    "schema dtype": (lambda d: d["schemas"][0]["arrays"]["state"].update(dtype="O"), "dtype='O'"),
    "no cameras": (lambda d: d["schemas"][0].update(cameras={}), "cameras should be a non-empty object"),
    "shard name": (lambda d: d["shards"][0].update(name="pipe:touch x"), "name="),
    "a column too many": (lambda d: d["columns"].update(member=d["columns"]["offset"]), "columns should name"),
    "a column missing": (lambda d: d["columns"].pop("size"), "columns should name"),
    "column dtype": (lambda d: d["columns"]["size"].update(dtype="<u8"), "dtype '<u4'"),
    "frames": (lambda d: _json(d, "frames", 44), "shape="),
    "samples": (lambda d: d["shards"][0].update(samples=d["shards"][0]["samples"] + 1), "samples="),
    "fewer fps values": (lambda d: _json(d, "prompts", []), "prompt code"),
}


def _listed(root):
    """The index at ``root`` as an older writer wrote it: ids and attributes listed in the JSON, no id columns."""
    from episodepipes.format import EPISODE_COLUMNS

    data = json.loads((root / "index.json").read_text())
    ids = [bytes(x).decode() for x in np.load(root / COLUMNS["ids"][0])]
    attr = np.load(root / COLUMNS["attr"][0])
    data["ids"] = ids
    data["episode_meta"] = [[n, data["attrs"][c]] for n, c in enumerate(attr.tolist()) if data["attrs"][c]]
    del data["attrs"]
    for name in EPISODE_COLUMNS:
        del data["columns"][name]
        (root / COLUMNS[name][0]).unlink()
    (root / "index.json").write_text(json.dumps(data))
    return root


LISTED_CASES = {
    "duplicate id": (lambda d: d["ids"].__setitem__(1, d["ids"][0]), "appears twice"),
    "id escapes": (lambda d: d["ids"].__setitem__(0, "../x"), "tar-safe episode id"),
    "id not a str": (lambda d: d["ids"].__setitem__(0, 7), "id=7"),
    "too few ids": (lambda d: d["ids"].pop(), "shape=[5, 7]"),
    "meta overrides the id": (lambda d: _json(d, "episode_meta", [[0, {"id": "x"}]]), "episode_meta entry"),
    "attrs beside ids": (lambda d: _json(d, "attrs", [{}]), "both ids and attrs"),
}


def test_an_index_listing_its_ids_opens_alike_and_upgrade_moves_them_to_columns(pair, tmp_path, caplog):
    copy = _listed(shutil.copytree(pair[1], tmp_path / "c"))
    old, new = EpisodeIndex.open(copy), EpisodeIndex.open(pair[1])
    assert "episodepipes-shard upgrade" in caplog.text and "ids" in old.meta and "ids" not in new.meta
    assert list(old.episodes) == list(new.episodes) and list(old.ids) == list(new.ids)
    assert old.episode("ep0001").meta == {"robot_type": "aloha", "scene_table": 2}
    upgrade(copy)
    assert _files(copy) == _files(pair[1])


@pytest.mark.parametrize("case", sorted(LISTED_CASES))
def test_every_crafted_listed_id_is_refused_in_one_line(pair, tmp_path, case):
    change, needle = LISTED_CASES[case]
    copy = _listed(shutil.copytree(pair[1], tmp_path / "c"))
    data = json.loads((copy / "index.json").read_text())
    change(data)
    (copy / "index.json").write_text(json.dumps(data))
    with pytest.raises(IndexFormatError) as e:
        EpisodeIndex.open(copy)
    msg = str(e.value)
    assert msg.startswith(str(copy / "index.json")) and needle in msg and "\n" not in msg, msg


@pytest.mark.parametrize("case", sorted(JSON_CASES))
def test_every_crafted_v2_field_is_refused_in_one_line(pair, tmp_path, case):
    change, needle = JSON_CASES[case]
    copy = shutil.copytree(pair[1], tmp_path / "c")
    data = json.loads((copy / "index.json").read_text())
    change(data)
    (copy / "index.json").write_text(json.dumps(data))
    with pytest.raises(IndexFormatError) as e:
        EpisodeIndex.open(copy)
    msg = str(e.value)
    assert msg.startswith(str(copy / "index.json")) and needle in msg and "\n" not in msg, msg


def test_tables_that_do_not_tile_the_frames_are_refused(pair, tmp_path):
    copy = shutil.copytree(pair[1], tmp_path / "c")
    ep = np.load(copy / COLUMNS["episodes"][0])
    ep[2, 1] += 1  # episode 2 one frame longer: the rows overlap episode 3
    _save(copy, "episodes", ep)
    with pytest.raises(IndexFormatError, match="episode 'ep0003': its first frame row"):
        EpisodeIndex.open(copy)


def test_as_v1_and_back_round_trips(pair, tmp_path):
    copy = as_v1(shutil.copytree(pair[1], tmp_path / "c"))
    assert json.loads((copy / "index.json").read_text()) == json.loads((pair[0] / "index.json").read_text())
    upgrade(copy)
    assert _files(copy) == _files(pair[1])


def test_a_pickled_v2_index_maps_its_columns_again(pair):
    import pickle

    index = EpisodeIndex.open(pair[1])
    blob = pickle.dumps(index.episodes[2])
    assert len(blob) < 4000  # the index travels as its path, not as its columns
    again = pickle.loads(blob)
    assert again == index.episodes[2] and again.frame_range(3) == index.episodes[2].frame_range(3)


def test_a_streamed_column_header_is_numpys_and_is_made_without_the_column():
    """An in-place merge streams 10**8-row columns: their header must not cost the column's bytes (counted)."""
    import tracemalloc

    from episodepipes.format import npy_bytes
    from episodepipes.index.v2 import streamed_header

    for dtype, shape in (("<u8", (5, 7)), ("<u8", (0, 3)), ("<u4", (11,)), ("<i8", (2**33,)), ("|S9", (4,))):
        small = tuple(min(n, 3) for n in shape)
        want = npy_bytes(np.zeros(small, dtype))[:-int(np.prod(small)) * np.dtype(dtype).itemsize or None]
        got = streamed_header(np.dtype(dtype), small)
        assert got == want, (dtype, shape)
        assert len(streamed_header(np.dtype(dtype), shape)) == len(got)  # still one 1.0 header at any size
    tracemalloc.start()
    streamed_header(np.dtype("<u8"), (10**8,))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1 << 20
