"""The codec layer on real footage: size, quality and single-thread decode rate of h264/AV1 packets vs JPEG q90.

Footage: Debian's ``python3-imageio`` (cockatoo.mp4) and ``opencv-doc`` (vtest.avi), installed with apt if
missing, resized to 480x640 and cut into episodes. Every format encodes the same frames; PSNR is RGB against
them. Decode columns are frames returned per CPU-second of one thread (the best of ``--repeats`` passes, each
with a fresh decoder), relative to ``cv2.imdecode`` of the JPEGs into the same RGB ``[3, H, W]`` layout:
- sequential: every frame of every episode in order (the pinned video pipe);
- sparse: K random frames per episode, each decoded from its keyframe (the metric pipe);
- window: history windows of W frames ending at random steps, in random order (the train pipe).
Framing: tar bytes beyond the payload (one camera's packets plus two per-step arrays) for per-frame members
against one member per GOP and per chunk of whole GOPs, at 224x224 and 480x640.

    python benchmarks/bench_codec.py [--frames 240] [--episode 60]

The ``codec`` section of scripts/bench.py (`run`) is `benchmarks.codec_section`: the same footage through the
shard writer and the pipes, JPEG q90 shards side by side with h264/AV1 packed shards: AV1 at LeRobot's GOP-2
defaults, the settings the GOP x crf sweep (`benchmarks.codec_sweep`) chose, and h264 fastdecode rows for speed,
with each goal of the codec issue met or not.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("SVT_LOG", "1")  # libsvtav1 prints its banner to stderr per encoder otherwise

import av  # noqa: E402
import cv2  # noqa: E402
import numpy as np  # noqa: E402

from episodepipes.codec import (  # noqa: E402
    CodecOptions,
    PacketDecoder,
    Packets,
    copy_packets,
    encode_frames,
    pack_arrays,
    pack_packets,
    same_scheduling,
    tar_framing,
)

FOOTAGE = {"python3-imageio": "cockatoo.mp4", "opencv-doc": "vtest.avi"}
FORMATS = [("jpeg q90", None), ("h264 gop2", CodecOptions(codec="h264", gop=2)),
           ("h264 gop8", CodecOptions(codec="h264", gop=8)),
           ("h264 gop2 fastdecode", CodecOptions(codec="h264", gop=2, fast_decode=True)),
           ("h264 gop32 crf14 fastdecode", CodecOptions(codec="h264", gop=32, crf=14, fast_decode=True)),
           ("av1 gop2", CodecOptions(codec="av1", gop=2)), ("av1 gop8", CodecOptions(codec="av1", gop=8))]
K, W, WINDOWS = 4, 4, 8


def footage_paths() -> list[Path]:
    """The two clips, installing their Debian packages first if they are not there."""
    paths = []
    for pkg, name in FOOTAGE.items():
        listed = subprocess.run(["dpkg", "-L", pkg], capture_output=True, text=True).stdout
        if name not in listed and shutil.which("apt-get"):
            subprocess.run(["apt-get", "install", "-y", "-q", pkg], check=True, capture_output=True)
            listed = subprocess.run(["dpkg", "-L", pkg], capture_output=True, text=True).stdout
        hits = [line for line in listed.splitlines() if line.endswith("/" + name)]
        if not hits:
            raise SystemExit(f"{name} not found in package {pkg}; install it with: apt-get install -y {pkg}")
        paths.append(Path(hits[0]))
    return paths


def load(path: Path, frames: int, size: tuple[int, int]) -> np.ndarray:
    """Up to ``frames`` RGB frames of ``path`` resized to (height, width)."""
    out = []
    with av.open(str(path)) as c:
        for f in c.decode(video=0):
            out.append(cv2.resize(f.to_ndarray(format="rgb24"), size[::-1], interpolation=cv2.INTER_AREA))
            if len(out) == frames:
                break
    return np.stack(out)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    return float(10 * np.log10(255 ** 2 / max(np.mean((a.astype(np.float64) - b) ** 2), 1e-12)))


def jpeg_decode(data: bytes) -> np.ndarray:
    bgr = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    out = np.empty((3, *bgr.shape[:2]), np.uint8)
    cv2.split(bgr, [out[2], out[1], out[0]])
    return out


class Encoded:
    """One format's episodes: JPEG bytes per frame, or `Packets` per episode."""

    def __init__(self, episodes: list[np.ndarray], options: CodecOptions | None) -> None:
        t = time.process_time()
        self.options = options
        if options is None:
            self.jpegs = [[cv2.imencode(".jpg", cv2.cvtColor(f, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, 90])[1]
                           .tobytes() for f in ep] for ep in episodes]
            self.sizes = [len(b) for ep in self.jpegs for b in ep]
        else:
            self.streams = [encode_frames(ep, options) for ep in episodes]
            self.sizes = [len(b) for p in self.streams for b in p.data]
        self.encode_fps = sum(map(len, episodes)) / (time.process_time() - t)

    def decoder(self) -> Callable[[int, int], np.ndarray]:
        """(episode, frame) -> RGB [3, H, W], through one reused decoder for a whole pass."""
        if self.options is None:
            return lambda e, t: jpeg_decode(self.jpegs[e][t])
        p0 = self.streams[0]
        keep = -(-W // self.options.gop) + 1
        d = PacketDecoder(p0.codec, p0.extradata, size=(p0.height, p0.width), keep=keep)

        def frame(e: int, t: int) -> np.ndarray:
            p: Packets = self.streams[e]
            k = p.keyframe_of(t)
            return d.frame((e, k), p.data[k:t + 1], t - k)

        return frame


def timed(make: Callable[[], Callable[[int, int], np.ndarray]], requests: list[tuple[int, int]]) -> float:
    """Frames per CPU-second of this thread for one pass with a fresh decoder (everything here decodes on the
    calling thread, so other processes on a shared machine do not skew it the way wall time does)."""
    fn = make()
    t = time.thread_time()
    for e, i in requests:
        if fn(e, i) is None:
            raise SystemExit(f"frame {i} of episode {e} did not decode")
    return len(requests) / (time.thread_time() - t)


def patterns(lengths: list[int], seed: int = 0) -> dict[str, list[tuple[int, int]]]:
    rng = np.random.default_rng(seed)
    seq = [(e, t) for e, n in enumerate(lengths) for t in range(n)]
    sparse = [(e, int(t)) for e, n in enumerate(lengths) for t in np.sort(rng.choice(n, K, replace=False))]
    ends = [(e, int(t)) for e, n in enumerate(lengths) for t in rng.integers(W - 1, n, WINDOWS)]
    rng.shuffle(ends)
    window = [(e, t - W + 1 + j) for e, t in ends for j in range(W)]
    return {"sequential": seq, f"sparse K={K}": sparse, f"window W={W}": window}


def framing(enc: Encoded, lengths: list[int], chunk: int) -> dict[str, float]:
    """Tar framing (plus pack tables) as a share of the payload: one camera's packets and two per-step arrays,
    as per-frame members (today's layout), one member each per GOP, and one each per chunk of whole GOPs."""
    buf = io.BytesIO()
    np.save(buf, np.zeros(7, np.float32))
    npy, step = len(buf.getvalue()), 2 * 7 * 4  # one step's .npy member as today's shards hold it; its payload
    payload = sum(enc.sizes) + sum(lengths) * step
    if enc.options is None:
        return {"per frame": tar_framing(enc.sizes + [npy] * 2 * len(enc.sizes)) / payload}
    out = {"per frame": tar_framing([s for p in enc.streams for s in map(len, p.data)] +
                                    [npy] * 2 * sum(lengths)) / payload}
    for name, frames in (("per GOP", 1), (f"per chunk>={chunk}", chunk)):
        members = []
        for p in enc.streams:
            for c in pack_packets(p, frames):
                n = len(c.ranges)
                arrays = pack_arrays({"action": np.zeros((n, 7), np.float32), "state": np.zeros((n, 7), np.float32)})
                members += [len(c.member), len(arrays)]
        out[name] = (tar_framing(members) + sum(members) - payload) / payload
    return out


def copy_rates(frames: np.ndarray, episode: int, workdir: Path) -> tuple[float, float, int]:
    """`copy_packets` of episodes sharing one LeRobot-style AV1 mp4 (libsvtav1, GOP 2, crf 30) against PyAV
    decoding the same file to RGB, in frames/s; and the episodes' leading packets in all."""
    path = workdir / "shared.mp4"
    with same_scheduling(), av.open(str(path), "w") as out:
        s = out.add_stream("libsvtav1", rate=30, options={"g": "2", "crf": "30", "preset": "12"})
        s.width, s.height, s.pix_fmt = frames.shape[2], frames.shape[1], "yuv420p"
        for i, a in enumerate(frames):
            f = av.VideoFrame.from_ndarray(a, format="rgb24")
            f.pts = i
            out.mux(s.encode(f))
        out.mux(s.encode())
    t = time.process_time()
    with av.open(str(path)) as c:
        n = sum(1 for f in c.decode(video=0) if f.to_ndarray(format="rgb24") is not None)
    decode = n / (time.process_time() - t)
    t, lead = time.process_time(), 0
    for a in range(0, len(frames), episode):
        lead += copy_packets(path, start=a / 30, end=min(a + episode, len(frames)) / 30).lead
    return len(frames) / (time.process_time() - t), decode, lead


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--frames", type=int, default=240, help="frames taken from each clip")
    ap.add_argument("--episode", type=int, default=60, help="frames per episode")
    ap.add_argument("--chunk", type=int, default=32, help="frames per packed chunk (whole GOPs)")
    ap.add_argument("--repeats", type=int, default=3, help="decode passes per pattern and format; the best counts")
    args = ap.parse_args()
    paths = footage_paths()
    for size in ((480, 640), (224, 224)):
        clips = [load(p, args.frames, size) for p in paths]
        cut = [[c[i:i + args.episode] for i in range(0, len(c), args.episode)] for c in clips]
        episodes = [e for eps in cut for e in eps]
        lengths = [len(e) for e in episodes]
        pats = patterns(lengths)
        print(f"\n## {size[0]}x{size[1]}: {len(episodes)} episodes of up to {args.episode} frames, "
              f"{len(clips[0])} + {len(clips[1])} frames ({', '.join(p.name for p in paths)})\n")
        print("| format | " + " | ".join(f"{p.name} bytes/frame (x smaller) | PSNR dB" for p in paths)
              + " | encode fps/CPU | " + " | ".join(f"{k} fps (x JPEG)" for k in pats) + " | framing / payload |")
        print("|---" * (3 + 2 * len(paths) + len(pats)) + "|")
        encoded = [(name, Encoded(episodes, options)) for name, options in FORMATS]
        rates = {name: dict.fromkeys(pats, 0.0) for name, _ in FORMATS}
        for _ in range(args.repeats):  # rounds across formats, so a busy moment hits every format alike
            for name, enc in encoded:
                for k, r in pats.items():
                    rates[name][k] = max(rates[name][k], timed(enc.decoder, r))
        base = rates[FORMATS[0][0]]
        jpeg: list[float] = []
        for name, enc in encoded:
            dec = enc.decoder()
            cells, first = [], 0
            for eps in cut:
                n = sum(map(len, eps))
                rows = range(first, first + len(eps))
                sizes = enc.sizes[sum(lengths[:first]):sum(lengths[:first]) + n]
                q = np.mean([psnr(dec(e, t).transpose(1, 2, 0), episodes[e][t]) for e in rows
                             for t in range(0, lengths[e], 3)])
                cells.append((float(np.mean(sizes)), float(q)))
                first += len(eps)
            jpeg = jpeg or [c[0] for c in cells]
            fr = framing(enc, lengths, args.chunk)
            print(f"| {name} | " + " | ".join(f"{b:,.0f} ({j / b:.1f}x) | {q:.1f}" for (b, q), j in zip(cells, jpeg))
                  + f" | {enc.encode_fps:.0f} | "
                  + " | ".join(f"{rates[name][k]:,.0f} ({rates[name][k] / base[k]:.2f})" for k in pats) + " | "
                  + ", ".join(f"{k} {v:.1%}" for k, v in fr.items()) + " |")
        if size == (480, 640):
            with tempfile.TemporaryDirectory() as tmp:
                copy, decode, lead = copy_rates(clips[0], args.episode + 1, Path(tmp))
            print(f"\ncopy: {copy:,.0f} frames per CPU-second copying {len(clips[0])} frames as episodes of "
                  f"{args.episode + 1} "
                  f"from one AV1 GOP-2 mp4 ({lead} leading packets kept), against {decode:,.0f} for PyAV "
                  f"decoding it: {copy / decode:.0f}x")


if __name__ == "__main__":
    main()


def run(workdir: Path, quick: bool) -> dict:
    """The ``codec`` section of scripts/bench.py (`benchmarks.codec_section`)."""
    from benchmarks.codec_section import run as section

    return section(workdir, quick)
