"""JPEG q90 shards against h264 and AV1 packed shards of the same real frames, one run, side by side.

480 frames of cockatoo.mp4 and vtest.avi (Debian's ``python3-imageio`` and ``opencv-doc``) at 480x640, in 8
episodes, written by the shard writer as JPEG q90 and as video shards: AV1 at GOP 2 (LeRobot's defaults; the
metric_pipe goal is at GOP 2), the settings chosen from the GOP x crf sweep (`benchmarks.codec_sweep`) as the
smallest that keep 40 dB PSNR in RGB as well as in luma (the storage goal), and h264 with x264's fastdecode tune
(no CABAC, no deblocking: the decode cost is the codec's, so these rows are for the speed goals; GOP 32 at crf 14
keeps 40 dB RGB, at crf 18 it decodes fewer bits a frame for the video_pipe goal, below 40 dB). PSNR is of what
video_pipe returns against the frames written, RGB (all three channels) and luma (BT.601 Y of both); the 4:2:0
round-trip row is what yuv420p alone costs with no codec loss (every video format here is 4:2:0), so it caps the
RGB figure of any of them.
Throughput: every round runs each format's passes in turn (bare decode at 1 and 2 threads, video_pipe, metric_pipe,
train_pipe), so a busy moment on a shared machine hits every format alike; figures are the median over rounds with
the range, ratios are per-round ratios to the JPEG pass of the same round (median, range), and CPU ms/frame (all
threads of the process) sits beside frames/s. The ceiling is the codec alone on the same bytes: ``cv2.imdecode`` of
the shards' JPEGs, or one ``av.CodecContext`` (``thread_count=1``) fed the shards' packets and ``to_ndarray(format=
"rgb24", threads=1)``, on 1 thread and on 2 (the episodes split, one context each), as the pipes run 2 decode threads.
Every pass starts with no decoders (nor the GOPs they keep) left from the pass before, as on a dataset far larger
than that cache. train_pipe (history window of 4 camera frames, batches of 16, 2 threads) takes the first 12 batches
of a shuffled pass over the episodes written 4 times (video copies hold the same packets): over one copy, a long GOP
would find half its GOPs still decoded by earlier samples; its note gives the packets decoded against what its
windows need decoded cold.
"""

from __future__ import annotations

import shutil
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import av
import cv2
import numpy as np

from benchmarks.bench_codec import footage_paths, load, psnr
from episodepipes.codec import CodecOptions, encode_frames
from episodepipes.codec.stream import DECODERS

JPEG = "jpeg q90"
GOP2 = {"av1 gop2 crf30": CodecOptions(codec="av1", gop=2, crf=30)}  # LeRobot's defaults, for the comparison
CHOSEN = {"h264 gop32 crf14": CodecOptions(codec="h264", gop=32, crf=14),  # the sweep's smallest at 40 dB RGB
          "av1 gop16 crf16": CodecOptions(codec="av1", gop=16, crf=16)}
FAST = {"h264 fastdecode gop2 crf18": CodecOptions(codec="h264", gop=2, crf=18, fast_decode=True),  # metric, train
        "h264 fastdecode gop32 crf14": CodecOptions(codec="h264", gop=32, crf=14, fast_decode=True),  # video, 40 dB
        "h264 fastdecode gop32 crf18": CodecOptions(codec="h264", gop=32, crf=18, fast_decode=True)}  # video goal
GOALS = {"storage": 5.0, "psnr": 40.0, "video": 1.0, "metric": 0.5, "train": 0.7}
HISTORY = 4  # camera frames of train_pipe's history window
COPIES = 4  # the train shards hold each episode this many times (see `train_shards`)
TRAIN_BATCHES = 12  # batches of 16 a train pass takes, a shuffled sample of the copies' frames
KINDS = ("ceil1", "ceil2", "video", "metric", "train")


def episodes(quick: bool) -> list[np.ndarray]:
    frames, episode = (60, 30) if quick else (240, 60)
    clips = [load(p, frames, (480, 640)) for p in footage_paths()]
    return [c[i:i + episode] for c in clips for i in range(0, len(c), episode)]


def luma_psnr(a: np.ndarray, b: np.ndarray) -> float:
    return psnr(*(cv2.cvtColor(np.ascontiguousarray(x), cv2.COLOR_RGB2YUV)[..., 0] for x in (a, b)))


def yuv420_round_trip(eps: list[np.ndarray]) -> tuple[float, float]:
    """Mean (RGB, luma) PSNR of RGB -> yuv420p -> RGB through swscale, as encoder and decoder convert: a lossless
    4:2:0 codec's result."""
    pairs = [(av.VideoFrame.from_ndarray(f, format="rgb24").reformat(format="yuv420p").to_ndarray(format="rgb24"), f)
             for ep in eps for f in ep]
    return float(np.mean([psnr(a, b) for a, b in pairs])), float(np.mean([luma_psnr(a, b) for a, b in pairs]))


def write(out: Path, eps: list[np.ndarray], opts: object) -> tuple[int, int, list[list[bytes]]]:
    """Write the episodes (RGB frames, two 7-float arrays per step) as shards: (shard bytes, payload bytes, each
    episode's JPEGs or packets as the shards hold them, for the bare-decode ceiling).

    ``opts``: the writer's `EncodeOptions`, or `CodecOptions` for encoder settings the writer does not take
    (``fast_decode``, ``preset``): `encode_frames`, the writer's own encoder, then makes the packets and the
    shards store them as `--codec copy` does, in the same packed layout."""
    from episodepipes.codec.chunk import parse_record
    from episodepipes.index import EpisodeIndex
    from episodepipes.sharding.episode import EpisodeData
    from episodepipes.sharding.write.encode import EncodeOptions, encode_episode
    from episodepipes.sharding.write.writer import ShardWriter
    from episodepipes.tarmembers import frame_fields

    shutil.rmtree(out, ignore_errors=True)
    rng = np.random.default_rng(0)
    codec = opts if isinstance(opts, CodecOptions) else None
    with ShardWriter(out, shard_size=64 << 20, options={}) as w:
        for k, ep in enumerate(eps):
            arrays = {"state": rng.standard_normal((len(ep), 7)).astype("<f4"),
                      "action": rng.standard_normal((len(ep), 7)).astype("<f4")}
            if codec is None:
                one = EpisodeData(f"ep{k:03d}", {"front": list(ep)}, arrays, 30.0, split="val")
            else:
                one = EpisodeData(f"ep{k:03d}", {}, arrays, 30.0, split="val",
                                  packets={"front": encode_frames(ep, codec)})
            w.add(encode_episode(one, EncodeOptions(codec="copy") if codec else opts))
    ix = EpisodeIndex.open(out)
    payload, units = 0, {e.id: [] for e in ix.episodes}
    for i, s in enumerate(ix.shards):
        data = (out / s.name).read_bytes()
        for e, seg in ix.segments_in(i):
            for k in range(seg.count):
                _, a, b = e.frame_range(seg.first + k)
                if ix.meta["layout"] == "packed":
                    rec = parse_record(data[a:b], 1, 2)
                    blobs = [bytes(x) for x in rec.cameras[0]]
                    payload += sum(map(len, blobs)) + sum(len(x) for x in rec.rows)
                else:
                    got, _ = frame_fields(lambda size, off, d=data: d[off:off + size], a, b, e.id, seg.first + k)
                    blobs = [bytes(got["front.jpg"])]
                    payload += len(blobs[0]) + 2 * 7 * 4  # the arrays' own bytes, not their .npy headers
                units[e.id] += blobs
    return sum(s.bytes for s in ix.shards), payload, list(units.values())


def ceiling(units: list[list[bytes]], codec: str | None, threads: int) -> tuple[float, float]:
    """(frames/s, CPU ms/frame) of the codec alone on the shards' bytes, the episodes split over ``threads``."""
    def work(part: list[list[bytes]]) -> int:
        n = 0
        if codec is None:
            for ep in part:
                for b in ep:
                    n += cv2.imdecode(np.frombuffer(b, np.uint8), cv2.IMREAD_COLOR) is not None
            return n
        ctx = av.CodecContext.create(DECODERS[codec], "r")
        ctx.thread_count = 1
        for pk in [av.Packet(b) for ep in part for b in ep] + [None]:  # episodes back to back: each starts at a key
            for f in ctx.decode(pk):
                n += f.to_ndarray(format="rgb24", threads=1) is not None  # one scaler thread, as the pipes
        return n

    parts = [units[i::threads] for i in range(threads)]
    t, c = time.perf_counter(), time.process_time()
    with ThreadPoolExecutor(threads) as ex:
        n = sum(ex.map(work, parts))
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    if n != sum(map(len, units)):
        raise SystemExit(f"the bare {codec or 'jpeg'} decode gave {n} frames, not {sum(map(len, units))}")
    return n / wall, 1000 * cpu / n


def cold() -> None:
    """Forget the decoders (and the GOPs they keep) of earlier passes: a pass over a dataset far larger than the
    decoders' GOP cache finds nothing there from the pass before, and these passes re-read the same frames."""
    from episodepipes.pipes import videoframes

    videoframes._POOLS.clear()  # private on purpose: the benchmark resets a cache the library keeps per process


def decoded() -> int:
    """Packets decoded by this process's decoders since `cold`."""
    from episodepipes.pipes import videoframes

    return sum(p.decoded for p in videoframes._POOLS.values())


def train_shards(out: Path, eps: list[np.ndarray], units: list[list[bytes]], codec: str | None, gop: int) -> None:
    """The episodes ``COPIES`` times over, for train_pipe: its random windows over one copy would find half the
    GOPs of a long-GOP format still held by the decoders from earlier samples of the pass, a hit rate no dataset
    larger than the decoders' cache gives. Video copies store the same packets (`--codec copy`), not re-encoded."""
    from episodepipes.codec.stream import Packets
    from episodepipes.sharding.episode import EpisodeData
    from episodepipes.sharding.write.encode import EncodeOptions, encode_episode
    from episodepipes.sharding.write.writer import ShardWriter

    shutil.rmtree(out, ignore_errors=True)
    rng = np.random.default_rng(0)
    opts = EncodeOptions(jpeg_quality=90) if codec is None else EncodeOptions(codec="copy")
    with ShardWriter(out, shard_size=64 << 20, options={}) as w:
        for j in range(COPIES):
            for k, (ep, data) in enumerate(zip(eps, units)):
                arrays = {"state": rng.standard_normal((len(ep), 7)).astype("<f4"),
                          "action": rng.standard_normal((len(ep), 7)).astype("<f4")}
                if codec is None:
                    one = EpisodeData(f"ep{k:03d}c{j}", {"front": list(ep)}, arrays, 30.0, split="val")
                else:
                    p = Packets(codec, b"", ep.shape[1], ep.shape[2], data, np.arange(len(ep)) // gop * gop)
                    one = EpisodeData(f"ep{k:03d}c{j}", {}, arrays, 30.0, split="val", packets={"front": p})
                w.add(encode_episode(one, opts))


def timed_train(out: Path, gop: int | None) -> tuple[float, float, float]:
    """(frames/s, CPU ms/frame, packets decoded per sample over those a cold decode of its window needs) of the
    first ``TRAIN_BATCHES`` batches of a shuffled train_pipe pass with a camera history window."""
    from episodepipes.pipes import train_pipe

    cold()
    pipe = train_pipe(out, split="val", batch_size=16, seed=0, num_workers=2, history={"front": HISTORY})
    t, c, n, need = time.perf_counter(), time.process_time(), 0, 0
    for i, b in enumerate(pipe):
        n += len(b["frame"])
        first = np.maximum(b["frame"].numpy() - HISTORY + 1, 0)
        need += int((b["frame"].numpy() - first + 1 + (first % gop if gop else 0)).sum())
        if i + 1 == TRAIN_BATCHES:
            break
    fps, cpu = n / (time.perf_counter() - t), 1000 * (time.process_time() - c) / n
    return fps, cpu, (decoded() / need if gop else 1.0)


def timed(pipe: object) -> tuple[float, float]:
    """(frames/s, CPU ms/frame of this process) of one pass over a freshly built pipe."""
    cold()
    t, c, n = time.perf_counter(), time.process_time(), 0
    for b in pipe:  # type: ignore[attr-defined]
        n += len(b["frame"])
    return n / (time.perf_counter() - t), 1000 * (time.process_time() - c) / n


def quality(out: Path, ids: list[str], eps: list[np.ndarray]) -> tuple[float, float]:
    """Mean (RGB, luma) PSNR of every frame video_pipe returns against the frame written."""
    from episodepipes.pipes import video_pipe

    pairs = [(b["front"][i].numpy().transpose(1, 2, 0), eps[int(e[2:])][int(f)])
             for b in video_pipe(out, episodes=ids, batch_size=16, max_batches=10**6)
             for i, (e, f) in enumerate(zip(b["episode"], b["frame"]))]
    if len(pairs) != sum(map(len, eps)):
        raise SystemExit(f"{out}: video_pipe gave {len(pairs)} frames, not {sum(map(len, eps))}")
    return float(np.mean([psnr(a, b) for a, b in pairs])), float(np.mean([luma_psnr(a, b) for a, b in pairs]))


def passes(out: Path, train: Path, ids: list[str], units: list[list[bytes]], codec: str | None,
           gop: int | None) -> dict[str, Callable]:
    from episodepipes.pipes import metric_pipe, video_pipe

    return {"ceil1": lambda: ceiling(units, codec, 1), "ceil2": lambda: ceiling(units, codec, 2),
            "video": lambda: timed(video_pipe(out, episodes=ids, batch_size=16, max_batches=10**6)),
            "metric": lambda: timed(metric_pipe(out, frames_per_episode=12, batch_size=12, sampling="random")),
            "train": lambda: timed_train(train, gop)}


def _stats(xs: list[float]) -> tuple[float, float, float]:
    return statistics.median(xs), min(xs), max(xs)


def _cell(fps: tuple[float, float, float], vs: tuple[float, float, float] | None, cpu: float) -> str:
    ratio = "" if vs is None else f" ({vs[0]:.2f}x, {vs[1]:.2f}-{vs[2]:.2f})"
    return f"{fps[0]:,.0f} [{fps[1]:,.0f}-{fps[2]:,.0f}]{ratio}, {cpu:.2f} ms"


def _goal(ok: bool | None) -> str:
    return "–" if ok is None else ("met" if ok else "not met")


def run(workdir: Path, quick: bool) -> dict:
    """The codec section on the benchmark footage: LeRobot's AV1 defaults, the storage settings, the speed ones."""
    return measure(workdir, episodes(quick), {**GOP2, **CHOSEN, **FAST}, rounds=2 if quick else 3,
                   source="cockatoo.mp4 + vtest.avi")


def measure(workdir: Path, eps: list[np.ndarray], codecs: dict[str, CodecOptions], *, rounds: int,
            source: str) -> dict:
    """JPEG q90 and each ``{name: CodecOptions}`` written from ``eps``, then ``rounds`` rounds of every format's
    passes in turn (see the module docstring)."""
    from episodepipes.sharding.write.encode import EncodeOptions

    ids = [f"ep{k:03d}" for k in range(len(eps))]
    formats: dict[str, tuple[str | None, object]] = {JPEG: (None, EncodeOptions(jpeg_quality=90))}
    for name, options in codecs.items():
        formats[name] = (options.codec, options)
    res: dict[str, dict] = {}
    for name, (codec, opts) in formats.items():
        out = workdir / name.replace(" ", "-")
        size, payload, units = write(out, eps, opts)
        rgb, luma = quality(out, ids, eps)  # also warms the page cache before any timed pass
        gop = opts.gop if codec else None
        train_shards(train := workdir / f"{name.replace(' ', '-')}-train", eps, units, codec, gop or 1)
        timed_train(train, gop)  # warm its page cache too
        res[name] = {"frames": list(map(len, eps)), "bytes": size, "payload": payload, "rgb": rgb, "luma": luma,
                     "gop": gop, "passes": passes(out, train, ids, units, codec, gop),
                     "runs": {k: [] for k in KINDS}}
    for _ in range(rounds):
        for r in res.values():
            for k, job in r["passes"].items():
                r["runs"][k].append(job())
    h, w = eps[0].shape[1:3]
    return _report(res, f"{sum(map(len, eps))} frames of {source} at {h}x{w} in {len(eps)} episodes",
                   yuv420_round_trip(eps))


def _report(res: dict[str, dict], note: str, yuv: tuple[float, float]) -> dict:
    jpeg = res[JPEG]
    n = sum(res[JPEG]["frames"])
    storage = [["4:2:0 round trip, no codec loss", "–", "–", f"{yuv[0]:.1f} / {yuv[1]:.1f}", "–", "–"]]
    speed, rows = [], []
    for name, r in res.items():
        x = jpeg["bytes"] / r["bytes"]
        framing = (r["bytes"] - r["payload"]) / r["payload"]
        met = None if name == JPEG else (x >= GOALS["storage"] and min(r["rgb"], r["luma"]) >= GOALS["psnr"])
        storage.append([name, f"{r['bytes'] / n:,.0f}", f"{x:.2f}x", f"{r['rgb']:.1f} / {r['luma']:.1f}",
                        f"{framing:.1%}", _goal(met)])
        fps = {k: _stats([x[0] for x in r["runs"][k]]) for k in KINDS}
        cpu = {k: statistics.median([x[1] for x in r["runs"][k]]) for k in KINDS}
        vs = {k: _stats([a[0] / b[0] for a, b in zip(r["runs"][k], jpeg["runs"][k])]) for k in KINDS}
        goal = {"video": vs["video"][0] >= GOALS["video"], "train": vs["train"][0] >= GOALS["train"],
                "metric": vs["metric"][0] >= GOALS["metric"] if r["gop"] == 2 else None}
        if name == JPEG:
            goal = dict.fromkeys(goal)
        reuse = statistics.median([x[2] for x in r["runs"]["train"]])
        cell = {k: _cell(fps[k], None if name == JPEG else vs[k], cpu[k]) for k in KINDS}
        speed.append([name, cell["ceil1"], cell["ceil2"], cell["video"], f"{fps['video'][0] / fps['ceil2'][0]:.2f}",
                      _goal(goal["video"]), cell["metric"], _goal(goal["metric"]), cell["train"],
                      _goal(goal["train"]), "–" if name == JPEG else f"{reuse:.2f}"])
        rows.append({"metric": f"{name}: decode ceiling, 2 threads", "ours": fps["ceil2"][0], "baseline": None,
                     "ceiling": None, "unit": "frames/s",
                     "note": ("cv2.imdecode of the shards' JPEGs" if name == JPEG else
                              "one av.CodecContext per thread fed the shards' packets, thread_count=1, rgb24")
                             + f"; {cpu['ceil2']:.2f} CPU ms/frame; 1 thread {fps['ceil1'][0]:,.0f} frames/s"})
        if name == JPEG:
            continue
        at_gop2 = f"not applicable (GOP {r['gop']})" if goal["metric"] is None else _goal(goal["metric"])
        jcpu = {k: statistics.median([x[1] for x in jpeg["runs"][k]]) for k in KINDS}
        spread = {k: f"judged on the median per-round ratio {vs[k][0]:.2f}x (range {vs[k][1]:.2f}-{vs[k][2]:.2f}x; "
                     f"the ratio of median frames/s beside it differs); in CPU time {jcpu[k] / cpu[k]:.2f}x "
                     f"({cpu[k]:.2f} CPU ms/frame vs JPEG's {jcpu[k]:.2f})" for k in KINDS}
        rows += [{"metric": f"{name}: shard bytes", "ours": r["bytes"], "baseline": jpeg["bytes"], "unit": "bytes",
                  "note": f"goal >= 5x at >= 40 dB: {_goal(met)}; PSNR RGB {r['rgb']:.1f} dB, luma {r['luma']:.1f} "
                          f"(JPEG {jpeg['rgb']:.1f} / {jpeg['luma']:.1f}); framing {framing:.1%}; {note}"},
                 {"metric": f"{name}: video_pipe (whole episodes)", "ours": fps["video"][0],
                  "baseline": fps_of(jpeg, "video"), "ceiling": fps["ceil2"][0], "unit": "frames/s",
                  "note": f"goal >= 1.0x JPEG: {_goal(goal['video'])}; {spread['video']}; ceiling: its codec alone, "
                          "2 threads"},
                 {"metric": f"{name}: metric_pipe (12 random frames/episode)", "ours": fps["metric"][0],
                  "baseline": fps_of(jpeg, "metric"), "ceiling": None, "unit": "frames/s",
                  "note": f"goal >= 0.5x JPEG at GOP 2: {at_gop2}; {spread['metric']}"},
                 {"metric": f"{name}: train_pipe (history window of {HISTORY} frames)", "ours": fps["train"][0],
                  "baseline": fps_of(jpeg, "train"), "ceiling": None, "unit": "frames/s",
                  "note": f"goal >= 0.7x JPEG: {_goal(goal['train'])}; {spread['train']}; frames are samples, "
                          f"each {HISTORY} camera frames; the first {TRAIN_BATCHES} batches of 16 of a shuffled "
                          f"pass over {COPIES} copies of the episodes; packets decoded {reuse:.2f}x those its "
                          "windows need decoded cold"}]
    return {"section": "codec", "intro": __doc__.split("\n\n", 1)[1].strip(), "rows": rows, "tables": [
        {"title": "storage and quality (same frames, one run; goal: >= 5x smaller than JPEG q90 at >= 40 dB, RGB "
                  "and luma)", "columns": ["format", "shard bytes/frame", "x smaller", "PSNR dB (RGB / luma)",
                                           "framing / payload", "storage goal"], "rows": storage},
        {"title": "frames/s: median [range] over rounds (x JPEG's pass of the same round, range), CPU ms/frame",
         "columns": ["format", "ceiling, 1 thread", "ceiling, 2 threads", "video_pipe", "video / ceiling",
                     "goal >= 1.0x", "metric_pipe", "goal >= 0.5x at GOP 2", f"train_pipe, history {HISTORY}",
                     "goal >= 0.7x", "train: packets decoded / cold"], "rows": speed}]}


def fps_of(r: dict, kind: str) -> float:
    return statistics.median([x[0] for x in r["runs"][kind]])
