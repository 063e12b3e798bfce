"""Crafted packed-layout indexes and damaged chunks: refused at open in one line, or frames corrupt and counted."""

from __future__ import annotations

import json
import shutil
import struct

import numpy as np
import pytest

from episodepipes.codec.chunk import parse_record
from episodepipes.format import COLUMNS
from episodepipes.index import EpisodeIndex, IndexFormatError
from episodepipes.pipes import metric_pipe, video_pipe
from episodepipes.sharding.formats.synthetic import SyntheticReader
from episodepipes.sharding.write.encode import EncodeOptions, encode_episode
from episodepipes.sharding.write.writer import ShardWriter


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    out = tmp_path_factory.mktemp("packed") / "s"
    reader = SyntheticReader(num_episodes=3, height=32, width=48, lengths=(70, 9, 12))
    with ShardWriter(out, shard_size=1 << 20, options={}) as w:
        for eid in reader.episode_ids():
            w.add(encode_episode(reader.read(eid), EncodeOptions(codec="h264", gop=4)))
    return out


@pytest.fixture
def copy(good, tmp_path):
    return shutil.copytree(good, tmp_path / "s")


def _column(out, name, change):
    path = out / COLUMNS[name][0]
    arr = np.load(path).copy()
    change(arr)
    np.save(path, arr, allow_pickle=False)


def _index(out, change):
    d = json.loads((out / "index.json").read_text())
    change(d)
    (out / "index.json").write_text(json.dumps(d))


def _second_chunk(ix):
    member = ix.tables.columns["member"]
    return int(np.flatnonzero(member[1:] != member[:-1])[0]) + 1  # ep0000 frame 64: its second chunk's first frame


def _set(idx, value):
    def change(a):
        a[idx] = value
    return change


COLUMN_CASES = {
    "key after its frame": ("key", lambda ix: _set(3, 5)),
    "key before the chunk": ("key", lambda ix: _set(_second_chunk(ix) + 1, _second_chunk(ix) - 1)),
    "key in another episode": ("key", lambda ix: _set(ix.episode("ep0001").rows.start, 0)),
    "key far back": ("key", lambda ix: _set(2, 2**63)),
    "member after its record": ("member", lambda ix: _set(slice(0, 1), int(ix.tables.offset[0]))),
    "member moved within the chunk": ("member", lambda ix: _set(_second_chunk(ix) + 3, 0)),
    "member past the shard": ("member", lambda ix: _set(slice(None), 2**40)),
    "records not back to back": ("offset", lambda ix: _set(4, int(ix.tables.offset[4]) + 1)),
    "record past the shard": ("size", lambda ix: _set(len(ix.tables.size) - 1, 2**31)),
    "chunk table too short": ("offset", lambda ix: _set(slice(0, 70), ix.tables.offset[:70] - 4)),
}


@pytest.mark.parametrize("case", sorted(COLUMN_CASES))
def test_crafted_packed_columns_are_refused_at_open(copy, case):
    name, change = COLUMN_CASES[case]
    _column(copy, name, change(EpisodeIndex.open(copy)))
    with pytest.raises(IndexFormatError) as e:
        EpisodeIndex.open(copy)
    assert str(copy / "index.json") in str(e.value) and "\n" not in str(e.value)


def _cam(d):
    return d["schemas"][0]["cameras"]["front"]


INDEX_CASES = {
    "unknown layout": (lambda d: d.update(layout="gop-members"), "layout='gop-members' is not one"),
    "layout not a str": (lambda d: d.update(layout=["packed"]), "layout=['packed']"),
    "packed without its key column": (lambda d: d["columns"].pop("key"), "columns should name exactly"),
    "members with packed columns": (lambda d: d.update(layout="members"), "columns should name exactly"),
    "no video camera": (lambda d: [c.pop(k) for c in d["schemas"][0]["cameras"].values() for k in ("codec", "gop")],
                        "has none"),
    "extradata not hex": (lambda d: _cam(d).update(extradata="zz"), "extradata"),
    "extradata odd": (lambda d: _cam(d).update(extradata="abc"), "extradata"),
    "extradata huge": (lambda d: _cam(d).update(extradata="00" * (1 << 17)), "extradata"),
    "extradata not a str": (lambda d: _cam(d).update(extradata=1), "extradata"),
    "extradata on a JPEG camera": (lambda d: [_cam(d).pop("codec"), _cam(d).pop("gop"),
                                              _cam(d).update(extradata="01")], "extradata"),
    "codec not decodable": (lambda d: _cam(d).update(codec="mjpeg"), "codec 'mjpeg'"),
}


@pytest.mark.parametrize("case", sorted(INDEX_CASES))
def test_crafted_packed_index_fields_are_refused_by_name(copy, case):
    change, needle = INDEX_CASES[case]
    _index(copy, change)
    with pytest.raises(IndexFormatError) as e:
        EpisodeIndex.open(copy)
    assert needle in str(e.value) and "\n" not in str(e.value)


def _record_at(out, eid, frame):
    ix = EpisodeIndex.open(out)
    shard, a, b = ix.episode(eid).frame_range(frame)
    return out / ix.shards[shard].name, a, b


def _frames(pipe):
    return {(e, int(f)): bool(v) for b in pipe for e, f, v in zip(b["episode"], b["frame"], b["valid"])}


def _without_crc(out):
    def change(d):
        d["crc32"] = False
        del d["columns"]["crc32"]
    _index(out, change)
    (out / COLUMNS["crc32"][0]).unlink()


@pytest.mark.parametrize("crc", [True, False])
@pytest.mark.parametrize("damage", ["count", "table", "head"])
def test_a_damaged_record_header_makes_its_gop_corrupt_never_a_crash(copy, crc, damage):
    path, a, b = _record_at(copy, "ep0001", 4)  # a keyframe: frames 4..7 decode from it
    data = bytearray(path.read_bytes())
    if damage == "count":  # the record's pack: an entry count far past its bytes
        data[a + 4:a + 8] = struct.pack("<I", 2**31)
    elif damage == "table":  # an end offset past the record
        data[a + 8:a + 12] = struct.pack("<I", b - a + 100)
    else:  # the head: camera 0's back says the decode starts 9 frames earlier (before the episode)
        n = struct.unpack("<I", data[a + 4:a + 8])[0]
        data[a + 8 + 4 * n:a + 10 + 4 * n] = struct.pack("<H", 9)
    path.write_bytes(bytes(data))
    if not crc:
        _without_crc(copy)
    pipe = video_pipe(copy, episodes=["ep0001"], batch_size=9, max_batches=1)
    got = _frames(pipe)
    bad = {4, 5, 6, 7}  # frame 4's record, and those whose GOP needs it
    assert {f for (_, f), v in got.items() if not v} == bad
    assert pipe.stats["frames_corrupt"] == 2 * len(bad)  # both cameras of each frame
    sparse = metric_pipe(copy, frames_per_episode=12, batch_size=4, split="train")
    assert {f for (e, f), v in _frames(sparse).items() if e == "ep0001" and not v} == bad


def test_a_damaged_chunk_table_leaves_frames_intact_and_verify_names_it(copy):
    path, a, _ = _record_at(copy, "ep0000", 0)
    data = bytearray(path.read_bytes())
    data[a - 8 - 4 * 64 + 4:a - 8 - 4 * 64 + 8] = struct.pack("<I", 7)  # the chunk's record count
    path.write_bytes(bytes(data))
    pipe = video_pipe(copy, episodes=["ep0000"], batch_size=35, max_batches=2)
    assert all(_frames(pipe).values()) and pipe.stats["frames_corrupt"] == 0  # records are read by the index
    problems = EpisodeIndex.open(copy).problems(members=True)
    assert any("sha256 mismatch" in p for p in problems)
    assert any("episode 'ep0000'" in p and "chunk at byte 0" in p for p in problems if "sha256" not in p)


def test_the_untouched_packed_index_verifies_and_records_parse(good):
    ix = EpisodeIndex.open(good, verify=True)
    assert ix.problems(members=True) == []
    path, a, b = _record_at(good, "ep0002", 5)
    rec = parse_record(path.read_bytes()[a:b], 2, len(ix.episode("ep0002").arrays))
    assert rec.backs == (1, 1) and [len(p) for p in rec.cameras] == [1, 1]


def _episode_chunks(ix, eid):
    rows = ix.episode(eid).rows
    member = ix.tables.columns["member"][rows]
    return rows, member


def test_an_episode_whose_chunk_points_back_at_the_previous_episodes_is_refused_at_open(copy):
    ix = EpisodeIndex.open(copy)
    rows0, member0 = _episode_chunks(ix, "ep0000")
    rows1, member1 = _episode_chunks(ix, "ep0001")
    first1 = rows1.start + int(np.sum(member1 == member1[0]))  # ep0001's first chunk: rows1.start .. first1
    _column(copy, "member", _set(slice(rows1.start, first1), int(member0[-1])))  # a 512-aligned header, but ep0000's
    with pytest.raises(IndexFormatError) as e:
        EpisodeIndex.open(copy)
    msg = str(e.value)
    assert f"frame row {rows1.start} (episode 'ep0001', frame 0)" in msg and "member" in msg and "\n" not in msg


def test_episodes_that_start_a_new_shard_restart_their_members_and_open(tmp_path):
    out = tmp_path / "s"
    reader = SyntheticReader(num_episodes=3, height=32, width=48, lengths=(20, 9, 12))
    with ShardWriter(out, shard_size=4096, options={}) as w:
        for eid in reader.episode_ids():
            w.add(encode_episode(reader.read(eid), EncodeOptions(codec="h264", gop=4)))
    ix = EpisodeIndex.open(out, verify=True)
    starts = [ix.tables.columns["member"][ix.episode(e).rows.start] for e in ("ep0001", "ep0002")]
    assert len(ix.shards) >= 3 and 0 in starts  # an episode began a shard: its member is below the one before's end
    assert ix.problems(members=True) == []


@pytest.mark.parametrize("case", [*sorted(COLUMN_CASES), "points back"])
def test_the_packed_checks_a_segment_at_a_time_refuse_what_the_whole_check_does(copy, case, monkeypatch):
    """The open checks runs of whole segments (bounded memory at 10**8 frames), the row before a run carried into
    it: a run of one segment each refuses every crafted column the one-run check refuses, and opens the intact."""
    from episodepipes.index import v2

    monkeypatch.setattr(v2, "_PACKED_ROWS", 1)
    assert len(EpisodeIndex.open(copy).tables.segments) > 1
    if case == "points back":
        test_an_episode_whose_chunk_points_back_at_the_previous_episodes_is_refused_at_open(copy)
    else:
        test_crafted_packed_columns_are_refused_at_open(copy, case)
