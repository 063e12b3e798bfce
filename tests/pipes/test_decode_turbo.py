"""JPEG frames decoded by libjpeg-turbo directly (`_decode.turbo`, simplejpeg) are OpenCV's pixels, bit for bit: the
frames the writer makes at every reduced scale and resize, other subsamplings, grayscale and progressive JPEGs; and
where that path is not sure (EXIF orientation, a frame cut short, a size other than the index's) the answer is
``cv2.imdecode``'s, as it was before."""

from __future__ import annotations

import struct

import cv2
import numpy as np
import pytest
from helpers import make_shards

from episodepipes.imagehead import header_size
from episodepipes.pipes import EpisodeIndex, ShardReader, decode_jpeg
from episodepipes.pipes._decode import turbo
from episodepipes.pipes.frames import reduced_flag
from episodepipes.pipes.plan import Item

SIZES = [None, (24, 32), (12, 16), (6, 8), (20, 30), (48, 64), (3, 4)]


def opencv(data: bytes, src: tuple[int, int], size: tuple[int, int] | None) -> np.ndarray | None:
    """Today's output, made the way the library made it before libjpeg-turbo was called directly."""
    bgr = cv2.imdecode(np.frombuffer(data, np.uint8), reduced_flag(src, size))
    if bgr is None:
        return None
    if size is not None and bgr.shape[:2] != tuple(size):
        bgr = cv2.resize(bgr, (size[1], size[0]), interpolation=cv2.INTER_AREA)
    return np.ascontiguousarray(bgr[..., ::-1].transpose(2, 0, 1))


def jpeg(img: np.ndarray, *params: int) -> bytes:
    return cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 90, *params])[1].tobytes()


@pytest.fixture(scope="module")
def writer_frames(tmp_path_factory):
    index = EpisodeIndex.open(make_shards(tmp_path_factory.mktemp("turbo") / "s", num_episodes=2, length=6,
                                          height=48, width=64))
    items = [Item(e.id, f) for e in index.episodes for f in range(e.length)]
    return [bytes(r.members[f"{c}.jpg"]) for r in ShardReader(index, items) for c in ("front", "wrist")]


def test_simplejpeg_is_installed_and_takes_the_writers_frames(writer_frames):
    assert turbo.available()
    for data in writer_frames:
        assert turbo.decode_rgb(data, header_size(data), 1) is not None  # the direct path, not the fallback


@pytest.mark.parametrize("size", SIZES)
def test_the_writers_frames_decode_to_opencvs_pixels(writer_frames, size):
    for data in writer_frames:
        want = opencv(data, (48, 64), size)
        got = decode_jpeg(data, src=(48, 64), size=size)
        assert np.array_equal(got, want)
        out = np.full_like(want, 7)
        assert decode_jpeg(memoryview(data), src=(48, 64), size=size, out=out) is out  # a mapped slice, a batch row
        assert np.array_equal(out, want)


@pytest.mark.parametrize("kind", ["444", "422", "gray", "progressive", "odd"])
def test_other_jpegs_decode_to_opencvs_pixels(kind):
    rng = np.random.default_rng(3)
    h, w = (37, 53) if kind == "odd" else (48, 64)
    img = cv2.GaussianBlur(rng.integers(0, 255, (h, w, 3), dtype=np.uint8), (5, 5), 0)
    data = {"444": lambda: jpeg(img, cv2.IMWRITE_JPEG_SAMPLING_FACTOR, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_444),
            "422": lambda: jpeg(img, cv2.IMWRITE_JPEG_SAMPLING_FACTOR, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_422),
            "gray": lambda: jpeg(img[..., 0]), "progressive": lambda: jpeg(img, cv2.IMWRITE_JPEG_PROGRESSIVE, 1),
            "odd": lambda: jpeg(img)}[kind]()
    assert turbo.decode_rgb(data, (h, w), 1) is not None
    for size in (None, (-(-h // 2), -(-w // 2)), (-(-h // 4), -(-w // 4)), (h // 3, w // 3)):
        assert np.array_equal(decode_jpeg(data, src=(h, w), size=size), opencv(data, (h, w), size)), size


def exif_oriented(data: bytes, orientation: int) -> bytes:
    """``data`` with an EXIF segment right after SOI whose Orientation tag is ``orientation``."""
    tiff = b"MM\x00\x2a" + struct.pack(">I", 8) + struct.pack(">H", 1) \
        + struct.pack(">HHIHH", 0x0112, 3, 1, orientation, 0) + struct.pack(">I", 0)
    body = b"Exif\x00\x00" + tiff
    return data[:2] + b"\xff\xe1" + struct.pack(">H", len(body) + 2) + body + data[2:]


def test_an_exif_orientation_is_applied_as_opencv_applies_it(writer_frames):
    data = exif_oriented(writer_frames[0], 3)  # turned 180 degrees
    assert turbo.has_exif(data) and not turbo.has_exif(writer_frames[0])
    assert turbo.decode_rgb(data, (48, 64), 1) is None  # simplejpeg would not turn it: OpenCV decodes
    got = decode_jpeg(data, src=(48, 64))
    assert np.array_equal(got, opencv(data, (48, 64), None))
    assert np.array_equal(got, opencv(writer_frames[0], (48, 64), None)[:, ::-1, ::-1])


def test_a_frame_cut_short_gets_opencvs_answer(writer_frames):
    data = writer_frames[1][:len(writer_frames[1]) * 2 // 3]  # libjpeg warns; OpenCV fills the rest with grey
    assert turbo.decode_rgb(data, (48, 64), 1) is None
    want = opencv(data, (48, 64), None)
    got = decode_jpeg(data, src=(48, 64))
    assert (got is None and want is None) or np.array_equal(got, want)


def test_a_frame_declaring_twice_the_index_size_is_refused():
    """simplejpeg would scale a 96x128 frame by 1/2 into a 48x64 buffer; the header check refuses it first."""
    big = jpeg(np.zeros((96, 128, 3), np.uint8))
    assert decode_jpeg(big, src=(48, 64)) is None
    assert decode_jpeg(big, src=(48, 64), size=(24, 32)) is None


def test_a_frame_declaring_more_than_its_buffer_allocates_nothing():
    """The buffer is the index's size: a header claiming 12000 x 12000 is refused by simplejpeg before it decodes."""
    data = bytearray(jpeg(np.zeros((48, 64, 3), np.uint8)))
    sof = data.index(b"\xff\xc0")
    data[sof + 5:sof + 9] = struct.pack(">HH", 12000, 12000)
    assert turbo.decode_rgb(bytes(data), (48, 64), 1) is None
    assert decode_jpeg(bytes(data), src=(48, 64)) is None


def test_a_png_frame_still_decodes_through_opencv():
    img = np.random.default_rng(0).integers(0, 255, (48, 64, 3), dtype=np.uint8)
    data = cv2.imencode(".png", img)[1].tobytes()
    assert turbo.decode_rgb(data, (48, 64), 1) is None
    assert np.array_equal(decode_jpeg(data, src=(48, 64)), img[..., ::-1].transpose(2, 0, 1))
