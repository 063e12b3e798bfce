"""The rows file of a ``--codec reference`` index: every step's arrays apart from its record's packets, so a step
read only for its arrays (an action horizon) reads its row and no packet; the virtual shards are still the copy
import's bytes, the rows checked by a CRC32 a block, and a rows file or field that lies is refused by name."""

from __future__ import annotations

import json
import zlib

import numpy as np
import pytest
from helpers import lerobot_in_place

from benchmarks.lerobot_data import VIDEO_KEYS
from episodepipes.codec import reference as ref
from episodepipes.codec.reference_layout import CameraPackets, layout
from episodepipes.errors import ShardIOError
from episodepipes.format import TAR_END
from episodepipes.index import EpisodeIndex, IndexFormatError
from episodepipes.pipes.train import train_pipe
from episodepipes.sharding.cli import main
from episodepipes.shardio import LocalSource

CAMS = [k.replace(".", "_") for k in VIDEO_KEYS]


def _episode(rng, video, lengths, width):
    """An episode of one camera whose packets lie back to back at the start of ``video``, and rows of ``width``."""
    n = len(lengths)
    pos = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    cam = CameraPackets(0, pos, np.asarray(lengths, np.int64), memoryview(video), 0)
    rows = rng.integers(0, 256, (n, width), np.uint8)
    return layout(b"ep", [cam], np.zeros((n, 1), np.int64), rows, [width // 2, width - width // 2]), rows


def test_the_rows_file_serves_the_copy_bytes_and_each_steps_rows_checked_by_block(tmp_path):
    rng = np.random.default_rng(0)
    video = rng.integers(0, 256, 1 << 15, np.uint8).tobytes()
    (tmp_path / "v.mp4").write_bytes(video)
    a, rows_a = _episode(rng, video, rng.integers(20, 200, 70), 8)  # two row blocks, a narrower episode first
    b, rows_b = _episode(rng, video, rng.integers(20, 200, 100), 12)
    pieces = ref.Pieces()
    pieces.extend(0, a)
    pieces.extend(len(a.blob), b)
    pieces.end_shard(len(a.blob) + len(b.blob))
    assert pieces.width == 12
    (tmp_path / "lit").write_bytes(bytes(pieces.literal))
    (tmp_path / "rows").write_bytes(pieces.rows_file())
    assert (tmp_path / "rows").stat().st_size == ref.rows_bytes(170, 12) == 170 * 12 + 4 * 3
    size = len(a.blob) + len(b.blob) + len(TAR_END)
    info = ref.FileInfo("v.mp4", len(video), *ref.stamp(lambda o, k: video[o:o + k], len(video)))
    folder = LocalSource(tmp_path)
    source = ref.ReferenceSource(str(tmp_path), folder, [("s.tar", size)], pieces.columns(), [info],
                                 ("lit", len(pieces.literal)), lambda name: (LocalSource(tmp_path), name), str,
                                 ShardIOError, "re-index", ("rows", 12, 170))
    assert source.read_file("s.tar") == a.blob + b.blob + TAR_END
    padded = np.vstack([np.hstack([rows_a, np.zeros((70, 4), np.uint8)]), rows_b])
    for row, count in [(0, 1), (60, 10), (63, 2), (70, 100), (169, 1)]:
        assert bytes(source.step_rows(row, count)) == padded[row:row + count].tobytes()
    with pytest.raises(ShardIOError, match="past its 170 steps"):
        source.step_rows(169, 2)
    raw = bytearray((tmp_path / "rows").read_bytes())
    raw[65 * 12] ^= 1  # step 65: the second block
    (tmp_path / "rows").write_bytes(bytes(raw))
    assert source.step_rows(65, 1) is None and source.step_rows(60, 10) is None
    assert bytes(source.step_rows(0, 64)) == padded[:64].tobytes()
    source.close()
    cols = pieces.columns()
    with pytest.raises(ValueError, match="outside the list"):  # rows pieces in an index that has no rows file
        ref.check_pieces(cols, [size], [len(video)], len(pieces.literal))
    with pytest.raises(ValueError, match="past the end of its file"):
        ref.check_pieces(cols, [size], [len(video)], len(pieces.literal), 170 * 12 - 1)


@pytest.fixture
def dataset(tmp_path):
    return lerobot_in_place(tmp_path)


def _horizon_valid(out, src):
    return [v for b in train_pipe(EpisodeIndex.open(out, source_root=src), batch_size=10, seed=0, rank=0,
                                  world_size=1, epochs=1, horizon={"action": 16}) for v in b["valid"].tolist()]


def test_a_changed_row_fails_its_blocks_crc32_in_the_samples_that_read_it(dataset):
    src, out = dataset
    assert all(_horizon_valid(out, src))
    path = out / "reference.rows.bin"
    width = json.loads((out / "index.json").read_text())["reference"]["rows"]
    raw = bytearray(path.read_bytes())
    raw[50 * width] ^= 0xFF  # episode 1's step 10: the second block of 64 steps
    path.write_bytes(bytes(raw))
    valid = _horizon_valid(out, src)
    assert 0 < valid.count(False) < len(valid)
    assert main(["verify", str(out), "--source-root", str(src)]) == 1  # the record holding that row fails too


@pytest.mark.parametrize("lie", ["width", "no field", "short file", "zero"])
def test_a_rows_field_or_file_that_lies_is_refused_by_name(dataset, lie):
    src, out = dataset
    data = json.loads((out / "index.json").read_text())
    path = out / "reference.rows.bin"
    if lie == "width":
        data["reference"]["rows"] += 1
    elif lie == "no field":  # the pieces still name the rows file
        del data["reference"]["rows"]
        del data["reference"]["hashes"]["reference.rows.bin"]
    elif lie == "short file":
        path.write_bytes(path.read_bytes()[:-1])
    else:
        data["reference"]["rows"] = 0
    (out / "index.json").write_text(json.dumps(data))
    match = {"width": r"reference\.rows\.bin holds", "no field": "reference pieces are damaged",
             "short file": r"reference\.rows\.bin holds", "zero": "reference rows='0' should be"}[lie]
    with pytest.raises(IndexFormatError, match=match):
        _horizon_valid(out, src)


def test_the_rows_file_is_each_steps_arrays_as_the_records_hold_them(dataset):
    src, out = dataset
    index = EpisodeIndex.open(out, source_root=src)
    width = index.meta["reference"]["rows"]
    rows = (out / "reference.rows.bin").read_bytes()
    assert len(rows) == ref.rows_bytes(70, width)
    assert zlib.crc32(rows[:64 * width]) == int(np.frombuffer(rows, "<u4", 1, 70 * width)[0])
    with index.shard_bytes(0) as shard:
        ep = index.episodes[1]
        for t in (0, 29):
            _, a, b = ep.frame_range(t)
            assert bytes(shard[b - width:b]) == rows[(40 + t) * width:(41 + t) * width]  # a record ends with its rows
