"""Packed records whose array row is not one step of the index's dtype and shape, in a dataset whose index vouches
for its shards (sha256 updated, no crc32): statistics read back (``stats --recompute``) refuse them naming the frame and
``verify`` reports them, as the pipes count such a frame corrupt; nothing reads a row in part."""

from __future__ import annotations

import hashlib
import json
import shutil
import struct

import numpy as np
import pytest

from episodepipes.codec.chunk import parse_record
from episodepipes.format import COLUMNS
from episodepipes.index import EpisodeIndex
from episodepipes.pipes import video_pipe
from episodepipes.sharding.formats.synthetic import SyntheticReader
from episodepipes.sharding.recompute import add_stats
from episodepipes.sharding.write.encode import EncodeOptions, encode_episode
from episodepipes.sharding.write.writer import ShardWriter


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    out = tmp_path_factory.mktemp("recompute") / "s"
    reader = SyntheticReader(num_episodes=2, height=32, width=48, lengths=(10, 9))
    with ShardWriter(out, shard_size=1 << 20, options={}) as w:
        for eid in reader.episode_ids():
            w.add(encode_episode(reader.read(eid), EncodeOptions(codec="h264", gop=4)))
    return out


def _without_crc(out):
    """The index as one written without checksums says it (a v2 index may carry none)."""
    d = json.loads((out / "index.json").read_text())
    d["crc32"] = False
    del d["columns"]["crc32"]
    (out / "index.json").write_text(json.dumps(d))
    (out / COLUMNS["crc32"][0]).unlink()


def _longer_row(out, episode: str, frame: int) -> None:
    """Frame's last packet 4 bytes shorter and its first array's row 4 bytes longer; the index's sha256 updated."""
    ix = EpisodeIndex.open(out)
    row = ix.episode(episode).rows.start + frame
    off, size = int(ix.tables.offset[row]), int(ix.tables.size[row])
    shard = out / ix.shards[0].name
    data = bytearray(shard.read_bytes())
    rec = parse_record(bytes(data[off:off + size]), 2, 3)
    last_packet = sum(len(c) for c in rec.cameras)  # its blob index: the head is blob 0
    at = off + 8 + 4 * last_packet
    (end,) = struct.unpack_from("<I", data, at)
    struct.pack_into("<I", data, at, end - 4)  # the last packet 4 bytes shorter, the first array's row 4 longer
    shard.write_bytes(bytes(data))
    d = json.loads((out / "index.json").read_text())
    d["shards"][0]["sha256"] = hashlib.sha256(data).hexdigest()
    (out / "index.json").write_text(json.dumps(d))


def test_a_packed_row_longer_than_its_step_is_refused_not_read_in_part(good, tmp_path):
    out = shutil.copytree(good, tmp_path / "s")
    _without_crc(out)
    _longer_row(out, "ep0000", 3)
    before = (out / "index.json").read_bytes()
    with pytest.raises(ValueError) as e:  # it read the row's first bytes: statistics of shifted values
        add_stats(out)
    msg = str(e.value)
    assert "ep0000" in msg and "frame 3" in msg and "action" in msg and "\n" not in msg
    assert (out / "index.json").read_bytes() == before


def test_packed_statistics_recomputed_are_the_episodes_own(good, tmp_path):
    out = shutil.copytree(good, tmp_path / "s")
    add_stats(out)
    reader = SyntheticReader(num_episodes=2, height=32, width=48, lengths=(10, 9))
    action = np.concatenate([reader.read(e).arrays["action"] for e in reader.episode_ids()]).astype(np.float64)
    got = EpisodeIndex.open(out).stats("action")
    assert got["count"] == 19
    assert np.allclose(got["mean"], action.mean(axis=0)) and np.array_equal(got["max"], action.max(axis=0))


def test_a_damaged_packed_record_is_refused_in_one_line(good, tmp_path):
    out = shutil.copytree(good, tmp_path / "s")
    _without_crc(out)
    ix = EpisodeIndex.open(out)
    row = ix.episode("ep0001").rows.start + 2
    off = int(ix.tables.offset[row])
    shard = out / ix.shards[0].name
    data = bytearray(shard.read_bytes())
    data[off:off + 4] = b"XXXX"  # no pack magic: the error left a view on the shard's map (BufferError)
    shard.write_bytes(bytes(data))
    with pytest.raises(ValueError) as e:
        add_stats(out)
    assert "ep0001" in str(e.value) and "frame 2" in str(e.value) and "\n" not in str(e.value)
    assert str(e.value).count("re-shard it") == 1


def test_verify_reports_a_packed_row_that_is_not_one_step(good, tmp_path):
    out = shutil.copytree(good, tmp_path / "s")
    _without_crc(out)
    _longer_row(out, "ep0001", 4)
    ix = EpisodeIndex.open(out)
    assert ix.problems() == []  # sha256 and offsets agree: only the records' own tables can tell
    found = ix.problems(members=True)  # it found none
    assert len(found) == 1 and "ep0001" in found[0] and "frame 4" in found[0] and "action" in found[0]
    assert "\n" not in found[0]
    pipe = video_pipe(out, episodes=["ep0001"], batch_size=9, max_batches=1)
    valid = {int(f): bool(v) for b in pipe for f, v in zip(b["frame"], b["valid"])}
    assert not valid[4] and pipe.stats["frames_corrupt"] >= 1  # what the pipes make of the same record
