"""Image bombs in sources: a small PNG or JPEG declaring 30000 x 30000 pixels (2.7 GB decoded), a side beyond 65500,
a frame of another size than frame 0, another format under a .png name, a sparse giant frame file. Each is refused
by its header or its size before it is decoded or read, naming the file (raw folders and LeRobot image cells; CLI:
one line, exit 2)."""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import cv2
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import write_raw

from benchmarks.lerobot_data import IMAGE_KEY, available_encoders, make_lerobot
from episodepipes.imagehead import header_size
from episodepipes.sharding.episode import EpisodeError
from episodepipes.sharding.formats.imagehead import MAX_IMAGE_BYTES
from episodepipes.sharding.formats.lerobot import LeRobotReader
from episodepipes.sharding.formats.raw import RawReader
from episodepipes.sharding.formats.synthetic import SyntheticReader

REPO = Path(__file__).resolve().parents[2]
SYN = SyntheticReader(num_episodes=2, length=8, height=32, width=40)
DATA = "data/chunk-000/file-000.parquet"


def _encoded(ext: str, h: int = 32, w: int = 40) -> bytes:
    ok, buf = cv2.imencode(ext, np.random.default_rng(0).integers(0, 255, (h, w, 3), np.uint8))
    assert ok
    return buf.tobytes()


def _declaring(data: bytes, h: int, w: int) -> bytes:
    """A real PNG or JPEG whose header now declares ``h`` x ``w`` (the PNG's IHDR CRC made right again)."""
    b = bytearray(data)
    if b[:4] == b"\x89PNG":
        b[16:24] = struct.pack(">II", w, h)
        b[29:33] = struct.pack(">I", zlib.crc32(bytes(b[12:29])))
    else:
        i = b.index(b"\xff\xc0")
        b[i + 5:i + 9] = struct.pack(">HH", h, w)
    assert header_size(bytes(b)) == (h, w)
    return bytes(b)


def test_the_header_gives_the_size_opencv_decodes():
    for ext in (".png", ".jpg"):
        data = _encoded(ext, 48, 64)
        assert header_size(data) == (48, 64) == cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR).shape[:2]
    assert header_size(_encoded(".bmp")) is None and header_size(b"\xff\xd8\xff") is None


def _read_all(src: Path, eid: str) -> None:
    for frames in RawReader(src).read(eid).cameras.values():
        list(frames)


CASES = {  # name -> (the frame file's bytes, what the refusal says)
    "png bomb": (lambda: _declaring(_encoded(".png"), 30000, 30000), r"declares 30000x30000 pixels, beyond 65500"),
    "jpeg bomb": (lambda: _declaring(_encoded(".jpg"), 30000, 30000), r"declares 30000x30000 pixels"),
    "side": (lambda: _declaring(_encoded(".png"), 1, 70000), r"declares 1x70000 pixels"),
    "other size, cut": (lambda: _declaring(_encoded(".png"), 16, 20)[:64], r"frame 3 is \(16, 20\), frame 0 was \(32, "
                        r"40\)"),
    "bmp": (lambda: _encoded(".bmp"), r"is not a decodable image \(no PNG or JPEG header\)"),
}


@pytest.mark.parametrize("case", CASES)
def test_a_raw_frame_is_refused_by_its_header_before_it_is_decoded(tmp_path, case):
    src = write_raw(tmp_path / "src", SYN)
    bad = src / "ep0000" / "front" / "000003.png"
    make, want = CASES[case]
    bad.write_bytes(make())
    with pytest.raises(EpisodeError, match=rf"episode 'ep0000'.*image {re.escape(str(bad))}.*{want}") as e:
        _read_all(src, "ep0000")
    assert "\n" not in str(e.value)
    _read_all(src, "ep0001")  # the others still read


def _sparse(path: Path) -> None:
    """A frame file of one byte more than the bound, costing no disk: a PNG header, then a hole."""
    with open(path, "wb") as f:
        f.write(_encoded(".png"))
        f.truncate(MAX_IMAGE_BYTES + 1)


def test_a_sparse_giant_frame_file_is_refused_by_its_size_before_it_is_read(tmp_path):
    src = write_raw(tmp_path / "src", SYN)
    bad = src / "ep0000" / "wrist" / "000002.png"
    _sparse(bad)
    with pytest.raises(EpisodeError, match=rf"image {re.escape(str(bad))} holds {MAX_IMAGE_BYTES + 1} bytes, more "
                                           rf"than the {MAX_IMAGE_BYTES}"):
        _read_all(src, "ep0000")


@pytest.mark.parametrize("case", ["png bomb", "sparse"])
def test_cli_refuses_an_image_bomb_in_one_line_with_exit_2(tmp_path, case):
    src = write_raw(tmp_path / "src", SYN)
    bad = src / "ep0001" / "front" / "000004.png"
    if case == "sparse":
        _sparse(bad)
    else:
        bad.write_bytes(CASES[case][0]())
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "shard.py"), "write", str(src), str(tmp_path / "out"),
                        "--workers", "1"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert re.search(r"episodepipes-shard: error: episode 'ep0001'.*000004\.png (declares 30000x30000|holds \d+ bytes)",
                     lines[0]), lines[0]


# --- LeRobot image cells -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def lerobot(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("lerobot-images") / "lr"
    make_lerobot(root, num_episodes=2, length=3, height=32, width=48, encoder=available_encoders(("h264",))[0])
    return root


def _cells(src: Path, cells: list) -> None:
    t = pq.read_table(src / DATA)
    col = pa.array(cells, pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
    pq.write_table(t.set_column(t.schema.get_field_index(IMAGE_KEY), IMAGE_KEY, col), src / DATA)


def _read_images(src: Path) -> None:
    reader = LeRobotReader(src)
    for eid in reader.episode_ids():
        list(reader.read(eid).cameras["observation_images_gripper"])


@pytest.mark.parametrize("case", ["png bomb", "jpeg bomb", "other size, cut", "bmp"])
def test_a_lerobot_image_cell_is_refused_by_its_header_before_it_is_decoded(lerobot, tmp_path, case):
    src = tmp_path / "lr"
    shutil.copytree(lerobot, src)
    good = pq.read_table(src / DATA).column(IMAGE_KEY).to_pylist()
    make, want = CASES[case]
    bad = make() if case != "other size, cut" else _declaring(_encoded(".png", 32, 48), 16, 20)[:64]
    want = want.replace(r"frame 3", r"frame 1").replace(r"\(32, 40\)", r"\(32, 48\)")
    _cells(src, [good[0], {"bytes": bad, "path": "frame_000001.png"}, *good[2:]])
    with pytest.raises(EpisodeError, match=rf"image feature '{IMAGE_KEY}' .* row 1: image.*{want}") as e:
        _read_images(src)
    assert "\n" not in str(e.value)


def test_a_lerobot_image_file_is_refused_by_its_size_before_it_is_read(lerobot, tmp_path):
    src = tmp_path / "lr"
    shutil.copytree(lerobot, src)
    _sparse(src / "big.png")
    n = pq.read_table(src / DATA).num_rows
    _cells(src, [{"bytes": None, "path": "big.png"}] * n)
    with pytest.raises(EpisodeError, match=rf"row 0: image path 'big.png' holds {MAX_IMAGE_BYTES + 1} bytes"):
        _read_images(src)
