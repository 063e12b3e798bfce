"""A ``--codec reference`` index is input from strangers, and its source files may change after indexing: a replaced
file is refused by name before its frames are used, a changed packet fails its frame's CRC32, and names that are
absolute, URLs or climb out of the source root (in the index, or through a link) are refused by name."""

from __future__ import annotations

import hashlib
import json
import os
import zlib

import av
import pytest
from helpers import lerobot_in_place

from benchmarks.lerobot_data import VIDEO_KEYS, make_lerobot
from episodepipes.codec import reference_pieces as pieces_file
from episodepipes.errors import ShardIOError
from episodepipes.index import EpisodeIndex, IndexFormatError
from episodepipes.pipes import video_pipe
from episodepipes.sharding.cli import main

CAM = VIDEO_KEYS[0].replace(".", "_")


@pytest.fixture
def dataset(tmp_path):
    return lerobot_in_place(tmp_path, lengths=(20, 20), height=240, width=320)


def _read(out, src, episode="episode_000000"):
    return [(b["frame"].tolist(), b["valid"].tolist()) for b in
            video_pipe(EpisodeIndex.open(out, source_root=src), episodes=[episode], batch_size=8, max_batches=10)]


def _video(src, key=VIDEO_KEYS[0]):
    return next((src / "videos" / key).rglob("*.mp4"))


def test_a_source_file_replaced_after_indexing_is_refused_by_name(dataset, tmp_path):
    src, out = dataset
    assert all(all(v) for _, v in _read(out, src))
    other = tmp_path / "other"  # the same dataset shape, other content: a re-encode replaced the file
    make_lerobot(other, lengths=(20, 20), num_episodes=2, episodes_per_file=2, gop=4, encoder="libx264", height=240,
                 width=320, image_feature=False, seed=1)
    os.replace(_video(other), _video(src))
    with pytest.raises(ShardIOError, match=f"{_video(src).name}.*changed after it was indexed.*re-index"):
        _read(out, src)
    assert main(["verify", str(out), "--source-root", str(src)]) == 2


def test_a_packet_changed_in_place_fails_its_frames_crc32(dataset):
    src, out = dataset
    path = _video(src)
    with av.open(str(path)) as c:
        packets = [(p.pos, p.size) for p in c.demux(video=0) if p.size]
    size = path.stat().st_size
    pos, n = next((p, z) for p, z in packets if 1 << 16 < p and p + z < size - (1 << 16))  # past the stamped ends
    data = bytearray(path.read_bytes())
    data[pos + n // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    frames = [(f, v) for fs, vs in _read(out, src) for f, v in zip(fs, vs)]
    bad = [f for f, v in frames if not v]
    assert bad and len(bad) < len(frames)  # the frames whose records hold the packet, and only those
    assert main(["verify", str(out), "--source-root", str(src)]) == 1


@pytest.mark.parametrize("name", ["../lr/videos/x.mp4", "/etc/passwd", "s3://bucket/x.mp4", "videos/../../x.mp4",
                                  "videos//x.mp4", ".hidden/x.mp4", "videos\\..\\x.mp4", "", 7])
def test_an_index_naming_a_file_outside_the_root_is_refused_by_name(dataset, name):
    src, out = dataset
    data = json.loads((out / "index.json").read_text())
    data["reference"]["files"][0][0] = name
    (out / "index.json").write_text(json.dumps(data))
    with pytest.raises(IndexFormatError, match="reference file 0.*source file name"):
        EpisodeIndex.open(out, source_root=src)


@pytest.mark.parametrize(("field", "value"), [("up", 0), ("up", 99), ("up", "../.."), ("literal", -1),
                                              ("files", {"a": 1}), ("hashes", {}), ("url", "s3://x")])
def test_hostile_reference_fields_are_refused(dataset, field, value):
    src, out = dataset
    data = json.loads((out / "index.json").read_text())
    data["reference"][field] = value
    (out / "index.json").write_text(json.dumps(data))
    with pytest.raises(IndexFormatError, match="reference"):
        EpisodeIndex.open(out, source_root=src)


def test_damaged_piece_columns_are_refused(dataset):
    src, out = dataset
    path = out / "reference.pieces.bin"
    raw = bytearray(path.read_bytes())
    raw[-5] ^= 0xFF  # the sha256 catches it first
    path.write_bytes(bytes(raw))
    with pytest.raises(IndexFormatError, match=r"reference\.pieces\.bin does not match its sha256"):
        _read(out, src)


def test_a_link_inside_the_root_that_points_out_of_it_is_refused(dataset, tmp_path):
    src, out = dataset
    path = _video(src)
    moved = tmp_path / "elsewhere.mp4"
    os.replace(path, moved)
    path.symlink_to(moved)
    with pytest.raises(ShardIOError, match="resolves outside the source root"):
        _read(out, src)


def _pieces(out):
    data = json.loads((out / "index.json").read_text())
    shards = [s["bytes"] for s in data["shards"]]
    return data, shards, pieces_file.decode((out / "reference.pieces.bin").read_bytes(), data["reference"]["pieces"],
                                            shards)


def _store(out, data, raw):
    (out / "reference.pieces.bin").write_bytes(raw)
    data["reference"]["hashes"]["reference.pieces.bin"] = hashlib.sha256(raw).hexdigest()
    (out / "index.json").write_text(json.dumps(data))


@pytest.mark.parametrize(("column", "change"), [("file", lambda a: a + 5), ("at", lambda a: a + 2**40)])
def test_pieces_that_lie_are_refused_even_with_their_sha256(dataset, column, change):
    src, out = dataset
    data, shards, cols = _pieces(out)
    cols[column] = change(cols[column])
    _store(out, data, pieces_file.encode(cols, shards))
    with pytest.raises(IndexFormatError, match="reference pieces are damaged"):
        _read(out, src)


@pytest.mark.parametrize("lie", ["count", "bomb", "tiling"])
def test_a_piece_file_that_does_not_hold_its_count_is_refused(dataset, lie):
    src, out = dataset
    data, shards, cols = _pieces(out)
    if lie == "count":
        data["reference"]["pieces"] -= 1
        raw = (out / "reference.pieces.bin").read_bytes()
    elif lie == "bomb":  # inflates to far more than the count allows: stopped at the count
        raw = pieces_file.MAGIC + zlib.compress(bytes(1 << 22))
    else:  # a shard's size that the pieces do not add up to
        shards[-1] += 1
        raw = pieces_file.encode(cols, shards)
    _store(out, data, raw)
    with pytest.raises(IndexFormatError, match=r"reference\.pieces\.bin is damaged"):
        _read(out, src)
