"""A ``--codec reference`` index's own bytes kept small: the literal bytes deflated in blocks (read back by range),
the per-frame columns in one deflated file (rebuilt in memory, then checked as mapped columns are). The virtual
shards stay the copy import's bytes; an index written before (literal bytes as they are, .npy columns) still reads
the same frames; a file or field that lies is refused by name."""

from __future__ import annotations

import hashlib
import json
import zlib

import numpy as np
import pytest
from helpers import lerobot_in_place

from episodepipes.codec import reference_blocks as blocks
from episodepipes.codec import reference_frames as frames_file
from episodepipes.format import COLUMNS, npy_bytes
from episodepipes.index import EpisodeIndex, IndexFormatError
from episodepipes.pipes import video_pipe
from episodepipes.pipes.train import train_pipe
from episodepipes.sharding.cli import main
from episodepipes.shardio import LocalSource


def test_a_block_file_serves_any_range_of_its_bytes(tmp_path):
    rng = np.random.default_rng(0)
    raw = bytes(rng.integers(0, 4, 10_000, np.uint8))  # compressible, as literal bytes are
    (tmp_path / "f").write_bytes(blocks.encode(raw, 1024))
    assert (tmp_path / "f").stat().st_size < len(raw) // 2
    f = blocks.BlockFile(LocalSource(tmp_path), "f", len(raw), IndexFormatError, "re-index")
    for off, size in [(0, 1), (0, 10_000), (1023, 2), (1024, 1024), (5000, 3333), (9999, 1), (10_000, 0)]:
        assert f.read("f", off, size) == raw[off:off + size]
    assert f.read_ranges("f", [(3, 4), (2048, 5000)]) == [raw[3:7], raw[2048:7048]]
    with pytest.raises(IndexFormatError, match="past its 10000 bytes"):
        f.read("f", 9999, 2)
    with pytest.raises(IndexFormatError, match=r"f says 10000 bytes in blocks of 1024, the index 10001"):
        blocks.BlockFile(LocalSource(tmp_path), "f", len(raw) + 1, IndexFormatError, "re-index")


@pytest.mark.parametrize("lie", ["magic", "table", "short", "block"])
def test_a_block_file_that_lies_is_refused_by_name(tmp_path, lie):
    raw = bytes(range(256)) * 20
    data = bytearray(blocks.encode(raw, 1024))
    start = blocks.table_bytes(len(raw), 1024)
    if lie == "magic":
        data[0] ^= 1
    elif lie == "table":
        data[start - 8] ^= 1  # the last block's end
    elif lie == "short":
        data = data[:start - 1]
    else:
        data[start + 5] ^= 0xFF  # inside the first block's deflated bytes
    (tmp_path / "f").write_bytes(bytes(data))
    match = {"magic": "does not start with its magic", "table": "does not tile", "short": "less than its table",
             "block": "block 0 does not inflate"}[lie]
    with pytest.raises(IndexFormatError, match=f"f .*{match}.*re-index"):
        blocks.BlockFile(LocalSource(tmp_path), "f", len(raw), IndexFormatError, "re-index").read("f", 0, 10)


def test_the_frames_file_gives_back_the_columns_and_refuses_a_count_or_value_that_lies():
    rng = np.random.default_rng(1)
    n = 300
    size = rng.integers(100, 5000, n)
    off = np.cumsum(size) - size + 1024 * (np.arange(n) // 64)  # a chunk's head before every 64th record
    member = (np.arange(n) // 64) * 64
    key = np.maximum(np.arange(n) - rng.integers(0, 3, n), member)
    cols = {"offset": off, "size": size, "crc32": rng.integers(0, 2**32, n), "member": member, "key": key}
    raw = frames_file.encode(cols)
    got = frames_file.decode(raw, n)
    for k in frames_file.NAMES:
        assert got[k].dtype == np.dtype(COLUMNS[k][1]) and (got[k].astype(np.int64) == cols[k]).all(), k
    with pytest.raises(ValueError, match="does not hold 299 frames"):
        frames_file.decode(raw, n - 1)
    body = bytearray(zlib.decompress(raw[len(frames_file.MAGIC):]))
    body[19 * n] = 0x40  # the first offset's top byte (the gaps' eighth plane): past any shard
    with pytest.raises(ValueError, match="offset or member lies past any shard"):
        frames_file.decode(frames_file.MAGIC + zlib.compress(bytes(body)), n)
    body = bytearray(zlib.decompress(raw[len(frames_file.MAGIC):]))
    body[8 * n] = 1  # frame 0's key frame one frame back: before the first
    with pytest.raises(ValueError, match="key lies outside"):
        frames_file.decode(frames_file.MAGIC + zlib.compress(bytes(body)), n)


@pytest.fixture
def dataset(tmp_path):
    return lerobot_in_place(tmp_path)


def _older(out, into):
    """The index ``out`` as the writer before this layout wrote it: literal bytes as they are, .npy columns."""
    into.mkdir()
    data = json.loads((out / "index.json").read_text())
    ref = data["reference"]
    for p in out.iterdir():
        if p.name not in ("index.json", "reference.literal.z", "reference.frames.bin"):
            (into / p.name).write_bytes(p.read_bytes())
    src = LocalSource(out)
    literal = blocks.BlockFile(src, "reference.literal.z", ref["literal"], IndexFormatError, "").read(
        "", 0, ref["literal"])
    (into / "reference.literal.bin").write_bytes(literal)
    cols = frames_file.decode((out / "reference.frames.bin").read_bytes(), data["frames"])
    for name, col in cols.items():
        blob = npy_bytes(col)
        (into / COLUMNS[name][0]).write_bytes(blob)
        data["columns"][name] = {"dtype": COLUMNS[name][1], "shape": [len(col)],
                                 "sha256": hashlib.sha256(blob).hexdigest()}
    for name in ("reference.literal.z", "reference.frames.bin"):
        del ref["hashes"][name]
    ref["hashes"]["reference.literal.bin"] = hashlib.sha256(literal).hexdigest()
    (into / "index.json").write_text(json.dumps(data))
    return into


def _frames(out, src):
    pipe = train_pipe(EpisodeIndex.open(out, source_root=src), batch_size=10, seed=0, rank=0, world_size=1, epochs=1,
                      history={"observation_images_front": 2}, horizon={"action": 4})
    got = [(k, v.tolist()) for b in pipe for k, v in sorted(b.items()) if hasattr(v, "tolist")]
    assert len(got) > 10 and all(all(v) for k, v in got if k == "valid")
    return got


def test_the_index_holds_no_npy_frame_column_and_an_older_index_reads_the_same_bytes(dataset, tmp_path):
    src, out = dataset
    assert not any((out / COLUMNS[k][0]).exists() for k in frames_file.NAMES)
    assert not (out / "reference.literal.bin").exists()
    old = _older(out, tmp_path / "old")
    new_ix, old_ix = EpisodeIndex.open(out, source_root=src), EpisodeIndex.open(old, source_root=src)
    for k in frames_file.NAMES:
        assert (new_ix.tables.columns[k] == old_ix.tables.columns[k]).all()
    for s in new_ix.shards:  # both serve the copy import's bytes (the shards' sha256 are the copy's)
        for ix in (new_ix, old_ix):
            assert hashlib.sha256(ix.source.read(s.name, 0, s.bytes)).hexdigest() == s.sha256
    assert _frames(out, src) == _frames(old, src)
    assert main(["verify", str(old), "--source-root", str(src)]) == 0
    assert main(["verify", str(out), "--source-root", str(src)]) == 0
    # writing over the older index leaves none of its files
    assert main(["write", str(src), str(old), "--format", "lerobot", "--codec", "reference", "--overwrite"]) == 0
    assert sorted(p.name for p in old.iterdir()) == sorted(p.name for p in out.iterdir())


@pytest.mark.parametrize("lie", ["frames sha256", "frames count", "literal table", "frames in a copy index"])
def test_a_frames_or_literal_file_that_lies_is_refused_by_name(dataset, lie):
    src, out = dataset
    data = json.loads((out / "index.json").read_text())
    hashes = data["reference"]["hashes"]
    if lie == "frames sha256":
        raw = bytearray((out / "reference.frames.bin").read_bytes())
        raw[-1] ^= 1
        (out / "reference.frames.bin").write_bytes(bytes(raw))
    elif lie == "frames count":  # re-hashed: its count is checked, not only its sha256
        raw = frames_file.MAGIC + zlib.compress(zlib.decompress((out / "reference.frames.bin").read_bytes()[8:])[:-1])
        (out / "reference.frames.bin").write_bytes(raw)
        hashes["reference.frames.bin"] = hashlib.sha256(raw).hexdigest()
    elif lie == "literal table":
        raw = bytearray((out / "reference.literal.z").read_bytes())
        raw[blocks.table_bytes(data["reference"]["literal"]) - 1] ^= 0x40
        (out / "reference.literal.z").write_bytes(bytes(raw))
    else:
        data["layout"] = "members"
    (out / "index.json").write_text(json.dumps(data))
    match = {"frames sha256": r"reference\.frames\.bin does not match its sha256",
             "frames count": r"reference\.frames\.bin is damaged \(the frames file does not hold 70 frames\)",
             "literal table": r"reference\.literal\.z its table of 1 blocks does not tile",
             "frames in a copy index": r"reference\.frames\.bin holds a packed index's columns"}[lie]
    with pytest.raises(IndexFormatError, match=match):
        [b["valid"] for b in video_pipe(EpisodeIndex.open(out, source_root=src), episodes=["episode_000000"],
                                        batch_size=8, max_batches=2)]
