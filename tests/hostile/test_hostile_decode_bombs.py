"""Decoder bombs in shards: a JPEG frame whose SOF declares 12000 x 12000 and an h264 keyframe whose SPS declares
16000 x 16000 (in a packet or in the stream's extradata), each a few KB with the index's CRC32 right, so `verify`
passes. Readers check the header against the index's camera size before anything decodes it: such a frame is
``valid=False`` and counted, and the process never allocates the claimed size (its peak RSS is measured in a child,
for thread and process workers, through the metric, video and train pipes)."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from helpers import make_shards

import episodepipes
from episodepipes.codec.decode import PacketDecoder
from episodepipes.codec.encode import CodecOptions, encode_frames
from episodepipes.codec.sps import declared_pixels
from episodepipes.codec.stream import Packets
from episodepipes.format import COLUMNS
from episodepipes.imagehead import header_size
from episodepipes.index import EpisodeIndex
from episodepipes.pipes import decode_jpeg
from episodepipes.sharding.episode import EpisodeData
from episodepipes.sharding.write.encode import EncodeOptions, encode_episode
from episodepipes.sharding.write.writer import ShardWriter

H, W, N, GOP = 32, 48, 12, 4
BOMB_FRAMES = (4, 5, 6, 7)  # the second GOP (its keyframe's SPS, or the JPEG frames themselves)
GROWTH_MB = 100  # a pass over these tiny frames may grow the peak RSS by this much; a bomb frame needs 400+ MB

# Runs in a fresh interpreter so that its peak RSS is this pass's alone: every pipe kind over the dataset, then the
# peak growth of the process (threads) or of its reaped worker processes (method="process").
CHILD = """
import json, resource, sys
from episodepipes.pipes import metric_pipe, train_pipe, video_pipe
out, method = sys.argv[1], sys.argv[2]
def frames(pipe):
    return sorted([e, int(f), bool(v)] for b in pipe for e, f, v in zip(b["episode"], b["frame"], b["valid"]))
def peak():
    return max(resource.getrusage(who).ru_maxrss for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
before = peak()
got = {}
for name, make in [
        ("metric", lambda: metric_pipe(out, split="train", frames_per_episode=12, batch_size=4, method=method)),
        ("video", lambda: video_pipe(out, episodes=["ep0000"], batch_size=4, max_batches=3, method=method)),
        ("train", lambda: train_pipe(out, batch_size=4, seed=0, method=method))]:
    pipe = make()
    got[name] = {"frames": frames(pipe), "corrupt": pipe.stats["frames_corrupt"]}
    del pipe
got["growth_mb"] = (peak() - before) / 1024
print(json.dumps(got))
"""


def _pass(out: Path, method: str) -> dict:
    """Every pipe's frames over ``out`` and the peak RSS growth of the pass, from a child interpreter."""
    root = str(Path(episodepipes.__file__).resolve().parent.parent)  # the checkout this test imported
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-c", CHILD, str(out), method], capture_output=True, text=True, env=env,
                         cwd=root, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def _check(got: dict, cameras: int) -> None:
    for name in ("metric", "video", "train"):
        bad = sorted({f for _, f, v in got[name]["frames"] if not v})
        assert bad == list(BOMB_FRAMES), name
        assert got[name]["corrupt"] == sum(cameras for _, f, _ in got[name]["frames"] if f in BOMB_FRAMES), name
    assert got["growth_mb"] < GROWTH_MB, got["growth_mb"]


def _fix_crcs(out: Path, frames: tuple[int, ...]) -> None:
    """Make the index's CRC32s of ``frames`` and its shard's sha256 those of the shard as it now is."""
    ix = EpisodeIndex.open(out)
    ep = ix.episode("ep0000")
    crc = np.load(out / COLUMNS["crc32"][0]).copy()
    shard = out / ix.shards[0].name
    data = shard.read_bytes()
    for f in frames:
        _, a, b = ep.frame_range(f)
        crc[ep.rows.start + f] = zlib.crc32(data[a:b])
    np.save(out / COLUMNS["crc32"][0], crc, allow_pickle=False)
    d = json.loads((out / "index.json").read_text())
    d["shards"][0]["sha256"] = hashlib.sha256(data).hexdigest()
    d["columns"]["crc32"]["sha256"] = hashlib.sha256((out / COLUMNS["crc32"][0]).read_bytes()).hexdigest()
    (out / "index.json").write_text(json.dumps(d))


@pytest.fixture(scope="module")
def jpeg_bombs(tmp_path_factory) -> Path:
    """A JPEG dataset whose front camera's frames 4-7 declare 12000 x 12000 in their SOF (432 MB as BGR)."""
    out = make_shards(tmp_path_factory.mktemp("jpeg") / "s", num_episodes=1, length=N, height=H, width=W)
    ep = EpisodeIndex.open(out).episode("ep0000")
    shard = out / EpisodeIndex.open(out).shards[0].name
    data = bytearray(shard.read_bytes())
    for f in BOMB_FRAMES:
        _, a, b = ep.frame_range(f)
        i = data.index(b"\xff\xd8", a)  # the first camera member's JPEG (front, by name order)
        sof = data.index(b"\xff\xc0", i)
        assert header_size(bytes(data[i:b])) == (H, W)
        data[sof + 5:sof + 9] = struct.pack(">HH", 12000, 12000)
        assert header_size(bytes(data[i:b])) == (12000, 12000)
    shard.write_bytes(bytes(data))
    _fix_crcs(out, BOMB_FRAMES)
    assert EpisodeIndex.open(out).problems(members=True) == []
    return out


@pytest.mark.parametrize("method", ["thread", "process"])
def test_a_jpeg_declaring_another_size_is_corrupt_before_it_is_decoded(jpeg_bombs, method):
    _check(_pass(jpeg_bombs, method), cameras=1)


def test_decode_jpeg_refuses_a_header_of_another_size_or_format():
    import cv2

    ok, jpg = cv2.imencode(".jpg", np.zeros((H, W, 3), np.uint8))
    ok2, bmp = cv2.imencode(".bmp", np.zeros((H, W, 3), np.uint8))
    assert ok and ok2
    assert decode_jpeg(jpg.tobytes(), src=(H, W)).shape == (3, H, W)
    assert decode_jpeg(memoryview(jpg.tobytes()), src=(H, W)).shape == (3, H, W)  # mapped shards give views
    assert decode_jpeg(bmp.tobytes(), src=(H, W)) is None  # OpenCV would decode it (and any BMP's size)
    assert decode_jpeg(jpg.tobytes(), src=(H, W + 16)) is None


# -- h264 ------------------------------------------------------------------------------------------------------


class _Bits:
    """Bit reader of an RBSP, for rewriting an SPS in the test."""

    def __init__(self, data: bytes) -> None:
        self.bits, self.i = "".join(f"{b:08b}" for b in data), 0

    def u(self, n: int) -> int:
        self.i += n
        return int(self.bits[self.i - n:self.i], 2)

    def ue(self) -> int:
        z = self.bits.index("1", self.i) - self.i
        self.i += z
        return self.u(z + 1) - 1


def _ue(v: int) -> str:
    b = f"{v + 1:b}"
    return "0" * (len(b) - 1) + b


def _escape(rbsp: bytes) -> bytes:
    out, zeros = bytearray(), 0
    for b in rbsp:
        if zeros >= 2 and b <= 3:
            out.append(3)
            zeros = 0
        out.append(b)
        zeros = zeros + 1 if b == 0 else 0
    return bytes(out)


def _sps_claiming(sps: bytes, h: int, w: int) -> bytes:
    """An x264 SPS NAL (high profile, no scaling matrices, POC type 0 or 2) rewritten to declare ``h`` x ``w``."""
    r = _Bits(sps[1:].replace(b"\x00\x00\x03", b"\x00\x00"))
    if r.u(8) in (100, 110, 122, 244):  # profile, then constraint flags and level, then the SPS id
        r.u(16), r.ue()
        if r.ue() == 3:
            r.u(1)
        r.ue(), r.ue(), r.u(1)
        assert r.u(1) == 0
    else:
        r.u(16), r.ue()
    r.ue()
    poc = r.ue()
    assert poc in (0, 2)
    if poc == 0:
        r.ue()
    r.ue(), r.u(1)
    start = r.i
    r.ue(), r.ue()
    bits = r.bits[:start] + _ue(w // 16 - 1) + _ue(h // 16 - 1) + r.bits[r.i:].rstrip("0")  # ends at its stop bit
    bits += "0" * (-len(bits) % 8)
    return sps[:1] + _escape(int(bits, 2).to_bytes(len(bits) // 8, "big"))


def _nals(packet: bytes) -> list[bytes]:
    return [p.rstrip(b"\x00") for p in packet.split(b"\x00\x00\x01")[1:]]


def _claiming(packet: bytes, h: int, w: int, *, drop_sps: bool = False) -> bytes:
    out = b""
    for nal in _nals(packet):
        if nal[0] & 0x1F in (7, 8) and drop_sps:
            continue
        out += b"\x00\x00\x00\x01" + (_sps_claiming(nal, h, w) if nal[0] & 0x1F == 7 else nal)
    return out


def _write_video(out: Path, packets: Packets) -> Path:
    ep = EpisodeData(id="ep0000", cameras={}, packets={"front": packets}, fps=10.0,
                     arrays={"action": np.zeros((N, 2), np.float32)})
    with ShardWriter(out, shard_size=1 << 20, options={}) as w:
        w.add(encode_episode(ep, EncodeOptions()))
    assert EpisodeIndex.open(out, verify=True).problems(members=True) == []
    return out


def _stream() -> Packets:
    rng = np.random.default_rng(0)
    return encode_frames([rng.integers(0, 255, (H, W, 3), np.uint8) for _ in range(N)], CodecOptions(codec="h264",
                                                                                                     gop=GOP))


@pytest.fixture(scope="module")
def sps_bomb(tmp_path_factory) -> Path:
    """h264 packets whose second keyframe's SPS declares 16000 x 16000 (FFmpeg takes up to 16128 a side)."""
    p = _stream()
    data = list(p.data)
    data[4] = _claiming(data[4], 16000, 16000)
    assert declared_pixels(p.data[4]) == 48 * 32 and declared_pixels(data[4]) == 16000 * 16000
    return _write_video(tmp_path_factory.mktemp("h264") / "s", Packets("h264", b"", H, W, data, p.key))


@pytest.mark.parametrize("method", ["thread", "process"])
def test_an_h264_keyframe_declaring_another_size_is_corrupt_before_it_is_decoded(sps_bomb, method):
    _check(_pass(sps_bomb, method), cameras=1)


def test_h264_extradata_declaring_another_size_makes_every_frame_corrupt(tmp_path):
    """Parameter sets only in the extradata (an mp4's stream copied), declaring 16000 x 16000: nothing decodes."""
    p = _stream()
    params = b"".join(b"\x00\x00\x00\x01" + n for n in _nals(p.data[0]) if n[0] & 0x1F in (7, 8))
    extradata = _claiming(params, 16000, 16000)
    data = [_claiming(d, H, W, drop_sps=True) for d in p.data]
    out = _write_video(tmp_path / "s", Packets("h264", extradata, H, W, data, p.key))
    got = _pass(out, "thread")
    for name in ("metric", "video", "train"):
        assert got[name]["frames"] and not any(v for _, _, v in got[name]["frames"]), name
    assert got["growth_mb"] < GROWTH_MB, got["growth_mb"]
    good = _write_video(tmp_path / "good", Packets("h264", _claiming(params, H, W), H, W, data, p.key))
    assert all(v for _, _, v in _pass(good, "thread")["video"]["frames"])  # the same packets, honest extradata


def _avcc(packet: bytes) -> bytes:
    return b"".join(struct.pack(">I", len(n)) + n for n in _nals(packet))


def test_an_avcc_stream_copied_from_an_mp4_is_bounded_by_its_in_band_sps():
    """AVCC (length-prefixed NAL units, an avcC record as extradata), as packets copied from an mp4 come: the
    keyframe declaring 16000 x 16000 never reaches the decoder (``decoded`` counts the packets that did)."""
    p = _stream()
    sps, pps = (n for n in _nals(p.data[0]) if n[0] & 0x1F in (7, 8))
    record = bytes([1, sps[1], sps[2], sps[3], 0xFF, 0xE1]) + struct.pack(">H", len(sps)) + sps + b"\x01" + \
        struct.pack(">H", len(pps)) + pps
    data = [_avcc(d) for d in p.data]
    data[4] = _avcc(_claiming(p.data[4], 16000, 16000))
    dec = PacketDecoder("h264", record, size=(H, W))
    got = [dec.frame(t // GOP, data[t - t % GOP:t + 1], t % GOP) is not None for t in range(N)]
    assert got == [t not in BOMB_FRAMES for t in range(N)]
    assert dec.decoded == N - len(BOMB_FRAMES)  # the bomb's GOP: not one packet decoded
