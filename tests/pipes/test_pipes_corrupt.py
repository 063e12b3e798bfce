"""Data that is not what the index describes is corrupt (valid=False, counted, named), never returned as valid."""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import shutil
import tarfile

import cv2
import numpy as np
import pytest
from helpers import as_v1

from episodepipes.pipes import metric_pipe, video_pipe
from episodepipes.sharding.formats.synthetic import SyntheticReader
from episodepipes.sharding.write.encode import EncodeOptions, encode_episode
from episodepipes.sharding.write.writer import ShardWriter

METHODS = ["thread", "process"]
# the reader says so when it checks a frame, the decode worker when it does (local shards)
CRC = r"(crc32 mismatch|does not match its crc32)"


@pytest.fixture(scope="module")
def shards(shard_folder):
    return shard_folder("corrupt", num_episodes=3, length=8, height=48, width=64)


def _members(root):
    with tarfile.open(root / "shard-000000.tar") as tar:
        return {m.name: (m.offset_data, tar.extractfile(m).read()) for m in tar}


def _rewrite_index(root, fn):
    path = as_v1(root) / "index.json"  # the v1 layout: every frame's entry in the JSON
    data = json.loads(path.read_text())
    fn(data)
    path.write_text(json.dumps(data))


def _drop_crcs(data):
    """An index from before per-frame CRCs: the crafted frame below is then judged by its content alone."""
    for e in data["episodes"]:
        for s in e["segments"]:
            s.pop("crc32", None)


def _wrong_size_copy(shards, tmp_path, name):
    """A copy whose JPEG ``name`` is replaced, in place and at the same length, by a valid JPEG of another size."""
    root = shutil.copytree(shards, tmp_path / "s")
    off, old = _members(root)[name]
    ok, small = cv2.imencode(".jpg", np.full((16, 24, 3), 200, np.uint8))
    assert ok and len(small) < len(old)
    with open(root / "shard-000000.tar", "r+b") as f:
        f.seek(off)
        f.write(small.tobytes() + b"\0" * (len(old) - len(small)))  # bytes after the end marker are ignored
    _rewrite_index(root, _drop_crcs)
    return root


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("resize", [None, (24, 32)])
def test_a_valid_jpeg_of_the_wrong_size_is_corrupt(shards, tmp_path, method, resize, caplog):
    root = _wrong_size_copy(shards, tmp_path, "ep0001/000003.front.jpg")
    pipe = video_pipe(root, episodes=["ep0001"], batch_size=4, max_batches=10, method=method, resize=resize)
    with caplog.at_level(logging.WARNING):
        batches = list(pipe)
    assert [v for b in batches for v in b["valid"].tolist()] == [True] * 3 + [False] + [True] * 4
    assert not batches[0]["front"][3].any() and batches[0]["wrist"][3].any()  # the bad camera is zeros
    assert pipe.stats["frames_corrupt"] == 1 and pipe.stats["frames_decoded"] == 15
    assert "shard-000000.tar episode 'ep0001' frame 3" in caplog.text and "front" in caplog.text
    raising = video_pipe(root, episodes=["ep0001"], batch_size=4, max_batches=10, method=method, on_corrupt="raise")
    with pytest.raises(ValueError, match=r"shard-000000.tar episode 'ep0001' frame 3 \(camera/array front\)"):
        list(raising)


def _shard_episode(out, arrays):
    """One episode written by the project's writer, with ``arrays`` replacing the synthetic ones."""
    ep = SyntheticReader(num_episodes=1, length=6, height=32, width=48).read("ep0000")
    ep = dataclasses.replace(ep, arrays=arrays(ep.arrays), split="val")
    with ShardWriter(out, shard_size=1 << 22, options={"jpeg_quality": 90}) as w:
        w.add(encode_episode(ep, EncodeOptions()))
    return out, ep


@pytest.mark.parametrize("method", METHODS)
def test_a_big_endian_array_comes_back_with_its_values(tmp_path, method):
    root, ep = _shard_episode(tmp_path / "be", lambda a: {**a, "state": a["state"].astype(">f4")})
    pipe = video_pipe(root, episodes=["ep0000"], batch_size=6, max_batches=1, method=method)
    (batch,) = list(pipe)
    assert batch["valid"].all() and pipe.stats["frames_corrupt"] == 0
    np.testing.assert_array_equal(batch["state"].numpy(), ep.arrays["state"].astype("<f4"))


@pytest.mark.parametrize("method", METHODS)
def test_an_npy_member_that_disagrees_with_the_index_is_corrupt_not_reinterpreted(tmp_path, method, caplog):
    root, _ = _shard_episode(tmp_path / "le", lambda a: a)  # little-endian float32 members

    def claim_big_endian(data):
        for e in data["episodes"]:
            e["arrays"]["state"]["dtype"] = ">f4"

    _rewrite_index(root, claim_big_endian)
    pipe = metric_pipe(root, frames_per_episode=6, batch_size=6, method=method)
    with caplog.at_level(logging.WARNING):
        (batch,) = list(pipe)
    assert not batch["valid"].any() and pipe.stats["frames_corrupt"] == 6
    assert not batch["state"].any() and batch["action"].any()  # zeros, not the bytes read as big-endian
    assert "episode 'ep0000' frame 0 (camera/array state)" in caplog.text
    raising = metric_pipe(root, frames_per_episode=6, batch_size=6, method=method, on_corrupt="raise")
    with pytest.raises(ValueError, match=r"episode 'ep0000' frame 0 \(camera/array state\)"):
        list(raising)


def _flip_entropy_byte(root, name):
    """Flip one bit in the middle of a JPEG's entropy-coded data (no marker made or broken): it still decodes."""
    off, data = _members(root)[name]
    scan = data.index(b"\xff\xda") + 2 + int.from_bytes(data[data.index(b"\xff\xda") + 2:][:2], "big")
    k = next(i for i in range((scan + len(data)) // 2, len(data) - 2)
             if data[i] not in (0xFE, 0xFF) and data[i - 1] != 0xFF)
    bad = data[:k] + bytes([data[k] ^ 0x01]) + data[k + 1:]
    img = cv2.imdecode(np.frombuffer(bad, np.uint8), cv2.IMREAD_COLOR)
    assert img is not None and img.shape[:2] == (48, 64)  # what the check must catch: garbage that decodes
    with open(root / "shard-000000.tar", "r+b") as f:
        f.seek(off + k)
        f.write(bad[k:k + 1])


@pytest.mark.parametrize("method", METHODS)
def test_a_frame_whose_bytes_fail_the_crc_is_corrupt_even_if_it_decodes(shards, tmp_path, method, caplog):
    root = shutil.copytree(shards, tmp_path / "s")
    _flip_entropy_byte(root, "ep0002/000005.wrist.jpg")
    pipe = video_pipe(root, episodes=["ep0002"], batch_size=4, max_batches=10, method=method)
    with caplog.at_level(logging.WARNING):
        batches = list(pipe)
    assert [v for b in batches for v in b["valid"].tolist()] == [True] * 5 + [False] + [True] * 2
    assert not batches[1]["front"][1].any() and not batches[1]["wrist"][1].any()  # every camera of it zeroed
    assert not batches[1]["state"][1].any() and batches[1]["state"][0].any()
    assert pipe.stats["frames_corrupt"] == 2 and pipe.stats["frames_decoded"] == 14
    assert "shard-000000.tar episode 'ep0002' frame 5" in caplog.text and re.search(CRC, caplog.text)
    raising = video_pipe(root, episodes=["ep0002"], batch_size=4, max_batches=10, method=method, on_corrupt="raise")
    with pytest.raises(ValueError, match=r"episode 'ep0002' frame 5 .*" + CRC):
        list(raising)


def test_an_index_without_crcs_reads_as_before(shards, tmp_path):
    root = shutil.copytree(shards, tmp_path / "s")
    _flip_entropy_byte(root, "ep0002/000005.wrist.jpg")
    _rewrite_index(root, _drop_crcs)
    pipe = video_pipe(root, episodes=["ep0002"], batch_size=4, max_batches=10)
    assert all(v for b in pipe for v in b["valid"].tolist()) and pipe.stats["frames_corrupt"] == 0
