"""GOP x crf sweep of h264 and AV1 on the codec section's footage: bytes/frame against JPEG q90, PSNR RGB / luma.

The storage goal (>= 5x smaller than JPEG q90 at >= 40 dB) names no GOP, so this finds the settings that meet it,
in RGB as well as in luma. Bytes are the packets' own (the shards add the same small framing to every format);
frames decode through the shards' decoder (`PacketDecoder`), so PSNR is of what the pipes return. Two reference
rows: JPEG q90, and the yuv420p round trip with no codec loss (swscale there and back, which is what a lossless
4:2:0 codec returns): every format here is 4:2:0, and that round trip caps its RGB PSNR. The decode column is the
codec's own cost, the floor under any pipe: CPU ms/frame of one ``av.CodecContext`` (``thread_count=1``) fed every
packet in order, frames to rgb24 (for JPEG, ``cv2.imdecode``), the median of 3 passes. ``--fast-decode`` adds h264
rows with x264's fastdecode tune (`CodecOptions.fast_decode`).

    python -m benchmarks.codec_sweep [--quick] [--gops 2,8,16,32] [--av1-crf 16,20,23,26] [--h264-crf 10,14,18]
                                     [--fast-decode]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("SVT_LOG", "1")  # libsvtav1 prints its banner to stderr per encoder otherwise

import cv2  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.bench_codec import psnr  # noqa: E402
from benchmarks.codec_section import ceiling, episodes, luma_psnr, yuv420_round_trip  # noqa: E402
from episodepipes.codec import CodecOptions, PacketDecoder, encode_frames  # noqa: E402


def _scores(decoded: list[list[np.ndarray]], eps: list[np.ndarray]) -> tuple[float, float]:
    pairs = [(d, e) for ds, es in zip(decoded, eps) for d, e in zip(ds, es)]
    return float(np.mean([psnr(a, b) for a, b in pairs])), float(np.mean([luma_psnr(a, b) for a, b in pairs]))


def floor(units: list[list[bytes]], codec: str | None) -> float:
    """Median CPU ms/frame of 3 single-thread bare decodes of every frame (`benchmarks.codec_section.ceiling`)."""
    return statistics.median(ceiling(units, codec, 1)[1] for _ in range(3))


def jpeg_row(eps: list[np.ndarray]) -> tuple[float, float, float, float]:
    """(bytes/frame, RGB PSNR, luma PSNR, decode CPU ms/frame) of JPEG q90."""
    data = [[cv2.imencode(".jpg", cv2.cvtColor(f, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, 90])[1] for f in ep]
            for ep in eps]
    dec = [[cv2.cvtColor(cv2.imdecode(b, cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB) for b in ep] for ep in data]
    ms = floor([[b.tobytes() for b in ep] for ep in data], None)
    return sum(len(b) for ep in data for b in ep) / sum(map(len, eps)), *_scores(dec, eps), ms


def codec_row(eps: list[np.ndarray], options: CodecOptions) -> tuple[float, float, float, float, float]:
    """(bytes/frame, RGB PSNR, luma PSNR, encoded frames per CPU-second, decode CPU ms/frame) of one setting."""
    t = time.process_time()
    streams = [encode_frames(ep, options) for ep in eps]
    enc = sum(map(len, eps)) / (time.process_time() - t)
    decoded = []
    for p in streams:
        d = PacketDecoder(p.codec, p.extradata, size=(p.height, p.width))
        decoded.append([d.frame(p.keyframe_of(t), p.data[p.keyframe_of(t):t + 1], t - p.keyframe_of(t))
                        .transpose(1, 2, 0) for t in range(len(p))])
    ms = floor([p.data for p in streams], options.codec)
    return sum(len(b) for p in streams for b in p.data) / sum(map(len, eps)), *_scores(decoded, eps), enc, ms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="the codec section's --quick footage (120 frames)")
    ap.add_argument("--gops", default="2,8,16,32")
    ap.add_argument("--av1-crf", default="16,20,23,26")
    ap.add_argument("--h264-crf", default="10,14,18")
    ap.add_argument("--fast-decode", action="store_true", help="also h264 with x264's fastdecode tune")
    args = ap.parse_args()
    eps = episodes(args.quick)
    jb, jr, jl, jms = jpeg_row(eps)
    yr, yl = yuv420_round_trip(eps)
    print(f"{sum(map(len, eps))} frames at {eps[0].shape[1]}x{eps[0].shape[2]} in {len(eps)} episodes\n")
    print("| codec | GOP | crf | bytes/frame | x smaller | PSNR dB RGB / luma | goal (>= 5x, >= 40 dB RGB and luma) "
          "| decode CPU ms/frame (x JPEG) |")
    print("|---|---|---|---|---|---|---|---|")
    print(f"| jpeg q90 | – | – | {jb:,.0f} | 1.00x | {jr:.2f} / {jl:.2f} | – | {jms:.2f} |")
    print(f"| yuv420p round trip (no codec loss) | – | – | – | – | {yr:.2f} / {yl:.2f} | – | – |", flush=True)
    runs = [("av1", args.av1_crf, False), ("h264", args.h264_crf, False)] + (
        [("h264", args.h264_crf, True)] if args.fast_decode else [])
    for codec, crfs, fast in runs:
        for gop in map(int, args.gops.split(",")):
            for crf in map(int, crfs.split(",")):
                b, r, y, _, ms = codec_row(eps, CodecOptions(codec=codec, gop=gop, crf=crf, fast_decode=fast))
                met = "met" if jb / b >= 5 and min(r, y) >= 40 else "not met"
                print(f"| {codec}{' fastdecode' if fast else ''} | {gop} | {crf} | {b:,.0f} | {jb / b:.2f}x | "
                      f"{r:.2f} / {y:.2f} | {met} | {ms:.2f} ({ms / jms:.2f}x) |", flush=True)


if __name__ == "__main__":
    main()
