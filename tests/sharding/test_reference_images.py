"""Image features indexed in place (``--codec reference``): LeRobot image cells (embedded in the parquet, or paths
to files) and raw image folders, each frame pointing at its image's bytes where they lie; and the copy import of
image-only raw folders, read back."""

from __future__ import annotations

import hashlib
import json
import struct

import cv2
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import write_mp4, write_raw

from benchmarks.lerobot_data import IMAGE_KEY, VIDEO_KEYS, make_lerobot
from episodepipes.codec.image_pieces import ImageFiles
from episodepipes.codec.parquet_pages import Chunk, ParquetPagesError, read_values
from episodepipes.errors import ShardIOError
from episodepipes.index import EpisodeIndex, IndexFormatError
from episodepipes.pipes import metric_pipe, video_pipe
from episodepipes.pipes.train import train_pipe
from episodepipes.sharding.cli import main
from episodepipes.sharding.formats.reference_images import ParquetImages
from episodepipes.sharding.formats.synthetic import SyntheticReader


def _frames(path, **open_kw):
    """(episode, frame, camera) -> every frame the video pipe reads (RGB, CHW)."""
    index = EpisodeIndex.open(path, **open_kw)
    cams = sorted(index.episodes[0].cameras)
    return {(e, int(f), c): b[c][j].numpy() for b in video_pipe(index, episodes=[e.id for e in index.episodes],
                                                                 batch_size=4, max_batches=100)
            for j, (e, f) in enumerate(zip(b["episode"], b["frame"])) for c in cams}


def test_the_copy_import_of_image_only_raw_folders_reads_back_as_the_jpeg_import(tmp_path):
    src = write_raw(tmp_path / "raw", SyntheticReader(num_episodes=2, length=5, height=32, width=48))
    for codec in ("copy", "jpeg"):
        assert main(["write", str(src), str(tmp_path / codec), "--format", "raw", "--codec", codec]) == 0
    copy, jpeg = _frames(tmp_path / "copy"), _frames(tmp_path / "jpeg")
    assert len(copy) == 2 * 5 * 2 and copy.keys() == jpeg.keys()
    for k, img in copy.items():
        assert np.array_equal(img, jpeg[k]), k


def test_image_only_raw_folders_are_refused_in_place_with_the_fix(tmp_path, capsys):
    """The in-place index is the packed layout, which holds a video camera: images alone are the copy import's."""
    src = write_raw(tmp_path / "raw", SyntheticReader(num_episodes=2, length=5, height=32, width=48))
    assert main(["write", str(src), str(tmp_path / "ref"), "--format", "raw", "--codec", "reference"]) == 2
    err = capsys.readouterr().err
    assert "ep0000" in err and "all images" in err and "--codec copy" in err
    assert not (tmp_path / "ref" / "index.json").exists()


# LeRobot image features in place ------------------------------------------------------------------------------------

LENGTHS = (6, 5, 7)
VCAMS = [k.replace(".", "_") for k in VIDEO_KEYS]
ICAM = IMAGE_KEY.replace(".", "_")
WRITES = {  # how the parquet files are rewritten: pyarrow's own page kinds
    "snappy-dictionary": {},  # pyarrow's default (and LeRobot's): SNAPPY pages, the images in a dictionary page
    "snappy-plain": {"use_dictionary": False},
    "uncompressed": {"compression": "none", "use_dictionary": False},
    "uncompressed-v2": {"compression": "none", "data_page_version": "2.0"},
    "snappy-v2-small-pages": {"data_page_version": "2.0", "use_dictionary": False, "data_page_size": 2000},
}


def _rewrite(src, **kw):
    for f in sorted((src / "data").rglob("*.parquet")):
        pq.write_table(pq.read_table(f), f, **kw)


def _lerobot(src, write="snappy-dictionary", version="v3.0"):
    make_lerobot(src, lengths=LENGTHS, num_episodes=3, episodes_per_file=2, gop=3, version=version,
                 image_feature=True)
    _rewrite(src, **WRITES[write])
    return src


def _write(src, out, codec, fmt="lerobot", *args):
    assert main(["write", str(src), str(out), "--format", fmt, "--codec", codec, "--shard-size", "8kB", *args]) == 0
    return out


def _cells(src):
    """(episode index, frame) -> the image cell's pixels, decoded from pyarrow's read of the parquet (RGB, CHW)."""
    out = {}
    for f in sorted((src / "data").rglob("*.parquet")):
        t = pq.read_table(f, columns=[IMAGE_KEY, "episode_index", "frame_index"]).to_pylist()
        for row in t:
            bgr = cv2.imdecode(np.frombuffer(row[IMAGE_KEY]["bytes"], np.uint8), cv2.IMREAD_COLOR)
            out[row["episode_index"], row["frame_index"]] = bgr[:, :, ::-1].transpose(2, 0, 1)
    return out


def _same_as(ref, copy, cells):
    """Every frame of the in-place index: its video cameras the copy import's, its image camera the cell's."""
    assert ref.keys() == copy.keys() and len(ref) == sum(LENGTHS) * 3
    for (e, f, c), img in ref.items():
        want = cells[int(e.split("_")[-1]), f] if c == ICAM else copy[e, f, c]
        assert np.array_equal(img, want), (e, f, c)


@pytest.mark.parametrize(("write", "version"), [*((w, "v3.0") for w in sorted(WRITES)), ("snappy-dictionary", "v2.1")])
def test_lerobot_image_cells_are_read_from_the_parquet_pages(tmp_path, write, version):
    src = _lerobot(tmp_path / "lr", write, version)
    ref = _write(src, tmp_path / "ref", "reference")
    copy = _write(src, tmp_path / "copy", "copy")
    _same_as(_frames(ref, source_root=src), _frames(copy), _cells(src))
    meta = json.loads((ref / "index.json").read_text())
    assert {f[0] for f in meta["reference"]["files"]} == {  # no image file: the bytes are the parquet's
        p.relative_to(src).as_posix() for p in [*src.rglob("*.mp4"), *(src / "data").rglob("*.parquet")]}
    assert "images" not in meta["reference"] and not (ref / "reference.images.bin").exists()
    index = EpisodeIndex.open(ref, source_root=src)
    index.verify()
    assert index.problems(members=True) == []
    for s in index.shards:  # the virtual shards read through the pieces are the bytes the writer hashed
        assert hashlib.sha256(index.source.read(s.name, 0, s.bytes)).hexdigest() == s.sha256
    c = EpisodeIndex.open(copy)
    for name in ("episodes", "segments"):
        assert np.array_equal(c.tables.columns[name], index.tables.columns[name]), name


def test_snappy_copies_in_the_image_bytes_resolve_to_the_bytes_they_copy(tmp_path):
    """Consecutive PNGs share their header: snappy stores the second one's as a copy of the first's, so a frame is
    several pieces of the parquet file (the test fails if no frame took more than one)."""
    src = _lerobot(tmp_path / "lr", "snappy-plain")
    f = sorted((src / "data").rglob("*.parquet"))[0]
    images = ParquetImages(0, memoryview(f.read_bytes()), f, [IMAGE_KEY], str(f))
    _, _, values = images.cells[IMAGE_KEY]
    counts = np.diff(values.first)
    assert counts.min() >= 1 and counts.max() > 1
    data = f.read_bytes()
    blobs = pq.read_table(f, columns=[IMAGE_KEY]).column(IMAGE_KEY).to_pylist()
    for r, cell in enumerate(blobs):
        at, size = values.pieces(r)
        assert b"".join(data[a:a + z] for a, z in zip(at.tolist(), size.tolist())) == cell["bytes"]


def test_every_pipe_reads_the_image_feature_in_place(tmp_path):
    src = _lerobot(tmp_path / "lr")
    inside = _write(src, src / "episodepipes", "reference")
    index = EpisodeIndex.open(inside)
    cells = _cells(src)
    n = 0
    for b in metric_pipe(index, split="train", frames_per_episode=3, batch_size=2, num_workers=2):
        for e, f, img in zip(b["episode"], b["frame"], b[ICAM]):
            assert np.array_equal(img.numpy(), cells[int(e.split("_")[-1]), int(f)])
            n += 1
    assert n == 9
    for b in metric_pipe(index, split="train", frames_per_episode=2, batch_size=2, history={ICAM: 2}):
        for e, f, clip in zip(b["episode"], b["frame"], b[ICAM]):
            for k, img in enumerate(clip):
                assert np.array_equal(img.numpy(), cells[int(e.split("_")[-1]), max(int(f) - 1 + k, 0)])
    seen = 0
    for b in train_pipe(index, split="train", batch_size=4, seed=0, epochs=1, history={ICAM: 2},
                        horizon={"action": 3}):
        for j, (e, f) in enumerate(zip(b["episode"], b["frame"])):
            assert np.array_equal(b[ICAM][j][-1].numpy(), cells[int(e.split("_")[-1]), int(f)])
            seen += 1
    assert seen == sum(LENGTHS) // 4 * 4
    for cmd in ("verify", "info", "stats"):
        assert main([cmd, str(inside)]) == 0, cmd


def test_image_cells_naming_files_point_at_the_files(tmp_path):
    src = _lerobot(tmp_path / "lr")
    for f in sorted((src / "data").rglob("*.parquet")):  # cells with a path and no bytes: files under images/
        t = pq.read_table(f)
        cells = t.column(IMAGE_KEY).to_pylist()
        eps, frames = t.column("episode_index").to_pylist(), t.column("frame_index").to_pylist()
        for cell, e, k in zip(cells, eps, frames):
            p = src / "images" / f"episode_{e:06d}" / f"frame_{k:06d}.png"
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(cell["bytes"])
            cell["bytes"], cell["path"] = None, p.relative_to(src).as_posix()
        t = t.set_column(t.schema.get_field_index(IMAGE_KEY), IMAGE_KEY, pa.array(cells, t.column(IMAGE_KEY).type))
        pq.write_table(t, f)
    cells = {(e, k): v for (e, k), v in _cells_from_files(src).items()}
    ref, copy = _write(src, tmp_path / "ref", "reference"), _write(src, tmp_path / "copy", "copy")
    _same_as(_frames(ref, source_root=src), _frames(copy), cells)
    meta = json.loads((ref / "index.json").read_text())
    assert not any("images/" in f[0] for f in meta["reference"]["files"])  # the image files: a binary table
    assert meta["reference"]["images"]["count"] == sum(LENGTHS) and (ref / "reference.images.bin").exists()
    victim = src / "images" / "episode_000001" / "frame_000002.png"
    victim.write_bytes(victim.read_bytes()[:-1] + b"\0\0")  # one byte longer: the size tells
    with pytest.raises(ShardIOError, match="frame_000002.png changed after it was indexed.*re-index"):
        _frames(ref, source_root=src)


def _cells_from_files(src):
    out = {}
    for p in sorted((src / "images").rglob("*.png")):
        bgr = cv2.imread(str(p), cv2.IMREAD_COLOR)
        out[int(p.parent.name.split("_")[-1]), int(p.stem.split("_")[-1])] = bgr[:, :, ::-1].transpose(2, 0, 1)
    return out


@pytest.mark.parametrize("kw", [{"compression": "zstd"}, {"compression": "gzip", "use_dictionary": False}])
def test_other_codecs_are_refused_by_name_with_the_fix(tmp_path, kw, capsys):
    src = _lerobot(tmp_path / "lr")
    _rewrite(src, **kw)
    assert main(["write", str(src), str(tmp_path / "ref"), "--format", "lerobot", "--codec", "reference"]) == 2
    err = capsys.readouterr().err
    assert kw["compression"].upper() in err and "--codec copy" in err and IMAGE_KEY in err
    assert not (tmp_path / "ref" / "index.json").exists()


def test_a_parquet_file_rewritten_after_indexing_is_refused_by_name(tmp_path):
    src = _lerobot(tmp_path / "lr", "snappy-plain")
    ref = _write(src, tmp_path / "ref", "reference")
    _rewrite(src, compression="none", use_dictionary=False)  # the same rows, other bytes
    with pytest.raises(ShardIOError, match=r"file-000\.parquet changed after it was indexed"):
        _frames(ref, source_root=src)


def test_an_image_declaring_a_huge_size_is_refused_before_anything_decodes_it(tmp_path, capsys):
    src = _lerobot(tmp_path / "lr", "uncompressed")
    f = sorted((src / "data").rglob("*.parquet"))[0]
    t = pq.read_table(f)
    cells = t.column(IMAGE_KEY).to_pylist()
    png = bytearray(cells[2]["bytes"])
    png[16:24] = struct.pack(">II", 30000, 30000)  # IHDR's width and height: 2.7 GB decoded
    cells[2]["bytes"] = bytes(png)
    t = t.set_column(t.schema.get_field_index(IMAGE_KEY), IMAGE_KEY, pa.array(cells, t.column(IMAGE_KEY).type))
    pq.write_table(t, f, compression="none", use_dictionary=False)
    assert main(["write", str(src), str(tmp_path / "ref"), "--format", "lerobot", "--codec", "reference"]) == 2
    assert "declares 30000x30000 pixels" in capsys.readouterr().err


# raw image folders in place -----------------------------------------------------------------------------------------


def _raw(tmp_path):
    """Raw episodes: camera ``front`` an h264 mp4, ``wrist`` a folder of PNGs."""
    synth = SyntheticReader(num_episodes=3, length=6, height=32, width=48)
    src = write_raw(tmp_path / "raw", synth)
    for eid in synth.episode_ids():
        for png in (src / eid / "front").iterdir():
            png.unlink()
        (src / eid / "front").rmdir()
        write_mp4(src / eid / "front.mp4", list(synth.read(eid).cameras["front"]), "libx264", {"g": "4", "bf": "0"})
    return src


def _pixels(src):
    return {(d.name, int(p.stem), d2.name): cv2.imread(str(p), cv2.IMREAD_COLOR)[:, :, ::-1].transpose(2, 0, 1)
            for d in sorted(src.iterdir()) for d2 in sorted(d.iterdir()) if d2.is_dir()
            for p in sorted(d2.glob("*.png"))}


def test_raw_image_folders_point_at_their_files(tmp_path):
    src = _raw(tmp_path)
    ref, copy = _write(src, tmp_path / "ref", "reference", "raw"), _write(src, tmp_path / "copy", "copy", "raw")
    got, want, pixels = _frames(ref, source_root=src), _frames(copy), _pixels(src)
    assert got.keys() == want.keys() and len(got) == 3 * 6 * 2
    for (e, f, c), img in got.items():
        assert np.array_equal(img, pixels[e, f, c] if c == "wrist" else want[e, f, c]), (e, f, c)
    meta = json.loads((ref / "index.json").read_text())
    assert len(meta["reference"]["files"]) == 3 and meta["reference"]["images"]["count"] == 3 * 6
    index = EpisodeIndex.open(ref, source_root=src)
    index.verify()
    assert index.problems(members=True) == []
    assert main(["verify", str(ref), "--source-root", str(src)]) == 0
    victim = src / "ep0001" / "wrist" / "000003.png"
    victim.write_bytes(bytes(reversed(victim.read_bytes())))  # same size, other bytes: the stamp tells
    with pytest.raises(ShardIOError, match="000003.png changed after it was indexed"):
        _frames(ref, source_root=src)


def _images_table(ref, change):
    meta = json.loads((ref / "index.json").read_text())
    field = meta["reference"]["images"]
    files = ImageFiles.decode((ref / "reference.images.bin").read_bytes(), field["count"], field["names"])
    rows = [files[k] for k in range(len(files))]
    raw, meta["reference"]["images"] = ImageFiles.of(change(rows)).encode()  # as a stranger would write it
    (ref / "reference.images.bin").write_bytes(raw)
    meta["reference"]["hashes"]["reference.images.bin"] = hashlib.sha256(raw).hexdigest()
    (ref / "index.json").write_text(json.dumps(meta))


@pytest.mark.parametrize("name", ["../raw/ep0000/wrist/000000.png", "ep0000/../../x.png", ".hidden/x.png",
                                  "ep0000//x.png", "ep0000/wrist/", "s3://bucket/x.png", "é.png"])
def test_an_image_table_naming_a_file_outside_the_root_is_refused_on_open(tmp_path, name):
    src = _raw(tmp_path)
    ref = _write(src, tmp_path / "ref", "reference", "raw")
    _images_table(ref, lambda rows: [rows[0]._replace(name=name), *rows[1:]])
    with pytest.raises(IndexFormatError, match="reference.images.bin is damaged.*relative path"):
        _frames(ref, source_root=src)  # the table is read when a pass first reads the index


@pytest.mark.parametrize("lie", ["count", "names", "size"])
def test_an_image_table_that_lies_is_refused_on_open(tmp_path, lie):
    src = _raw(tmp_path)
    ref = _write(src, tmp_path / "ref", "reference", "raw")
    meta = json.loads((ref / "index.json").read_text())
    if lie == "size":
        _images_table(ref, lambda rows: [rows[0]._replace(bytes=2**63), *rows[1:]])
    else:
        meta["reference"]["images"][lie] += 1
        (ref / "index.json").write_text(json.dumps(meta))
    with pytest.raises(IndexFormatError, match="reference"):
        _frames(ref, source_root=src)  # the table is read when a pass first reads the index


def _chunks(f, leaf):
    md = pq.ParquetFile(f).metadata
    j = next(k for k in range(md.num_columns) if md.schema.column(k).path == leaf)
    out = []
    for g in range(md.num_row_groups):
        c = md.row_group(g).column(j)
        start = c.dictionary_page_offset if c.has_dictionary_page else c.data_page_offset
        out.append(Chunk(start, c.total_compressed_size, c.compression, c.num_values,
                         md.schema.column(j).max_definition_level))
    return out


@pytest.mark.parametrize("write", ["snappy-dictionary", "uncompressed-v2", "snappy-plain"])
def test_damaged_pages_are_refused_by_name_never_a_crash(tmp_path, write):
    """Every byte of the first pages, and one in 7 after, changed in turn: the column's pieces are read, or the
    pages refused with ParquetPagesError (no other exception, no hang)."""
    src = _lerobot(tmp_path / "lr", write)
    f = sorted((src / "data").rglob("*.parquet"))[0]
    chunks = _chunks(f, f"{IMAGE_KEY}.bytes")
    data = f.read_bytes()
    cells = pq.read_table(f, columns=[IMAGE_KEY]).column(IMAGE_KEY).to_pylist()
    values = read_values(memoryview(data), chunks, "x")
    assert [b"".join(data[a:a + z] for a, z in zip(*(x.tolist() for x in values.pieces(r))))
            for r in range(len(values))] == [c["bytes"] for c in cells]
    c = chunks[0]
    positions = [*range(c.start, c.start + 300), *range(c.start + 300, c.start + c.size, 7)]
    refused = 0
    for pos in positions:
        for flip in (0x01, 0x80, 0xFF):
            bad = bytearray(data)
            bad[pos] ^= flip
            try:
                got = read_values(memoryview(bytes(bad)), chunks, "x")
            except ParquetPagesError:
                refused += 1
            else:  # an image byte changed: still every row's pieces (the CRC32s and headers catch it later)
                assert len(got) == len(cells), pos
    assert refused > 0
