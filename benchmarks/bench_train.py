"""Training reads on real footage: `train_pipe` against a bare libjpeg-turbo decode of the same bytes, and webdataset.

Footage (`benchmarks.footage`): Debian's vtest.avi, Megamind.avi and cockatoo.mp4 cut into 2-camera episodes and
sharded by our writer (JPEG q90), at 224x224 (24 episodes x 150 steps) and 480x640 (12 x 150); generated frames
(`SyntheticReader`, smoother than footage and so kinder to a decoder) are kept as a second row only. A frame is one
step: two JPEGs and the state/action arrays. The ceiling is a bare ``simplejpeg.decode_jpeg`` (libjpeg-turbo) of the
same JPEG bytes, already in memory, on 2 threads; a second ceiling is bare ``cv2.imdecode`` the same way. Neither lays
out the RGB ``[3, H, W]`` arrays the pipes yield.

`train_pipe` reads a planned per-epoch permutation by seeking through the byte-range index: a full shuffle whose
resume state is a cursor. The usual alternative is webdataset's shard shuffle plus a bounded buffer
(``.shuffle(1000)``), which reads sequentially but only mixes frames within the buffer. Each repeat is a ceiling pass
followed at once by one epoch of each of our pipes (threads, processes, a camera window at 224) and, at 224, one epoch
of Grain's thread pool over the same JPEG bytes (the peers section's script, in a fresh process in Grain's venv), so
each ratio compares runs that saw the same machine; the notes give the median ratio and its range over the repeats,
in wall time and in CPU time (frames per CPU second of this process and its workers against the ceiling's, and CPU
ms per frame; process workers come from a fork server, so their CPU is read from /proc as each pass's pool closes,
``stats["worker_cpu_us"]``). The window row also counts JPEGs decoded against those its batches show. First batch:
from building the pipe (imports done) to its first batch; the peers section times it from a fresh process.
"""

from __future__ import annotations

import dataclasses
import resource
import shutil
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import cv2
import numpy as np

from episodepipes.format import npy_load
from episodepipes.index import EpisodeIndex
from episodepipes.pipes import ShardReader
from episodepipes.pipes.order.window import plan_windows
from episodepipes.pipes.plan import Item
from episodepipes.pipes.train import TrainReader, train_pipe
from episodepipes.sharding.formats.synthetic import SyntheticReader
from episodepipes.sharding.write.encode import EncodeOptions, encode_episode
from episodepipes.sharding.write.writer import ShardWriter

BATCH = 32


def make_data(out: Path, *, episodes: int, length: int) -> EpisodeIndex:
    """Train-only shards of synthetic 224x224 episodes (two cameras), about 4 MB each."""
    shutil.rmtree(out, ignore_errors=True)
    reader = SyntheticReader(num_episodes=episodes, length=length, height=224, width=224)
    with ShardWriter(out, shard_size=4 << 20, options={"jpeg_quality": 90}) as w:
        for eid in reader.episode_ids():
            w.add(encode_episode(dataclasses.replace(reader.read(eid), split="train"), EncodeOptions()))
    return EpisodeIndex.open(out)


def _best(fn: Callable[[], int], repeat: int) -> float:
    """Best frames/s of ``repeat`` runs of ``fn`` (which returns the frames it produced)."""
    best = 0.0
    for _ in range(repeat):
        t0 = time.perf_counter()
        n = fn()
        best = max(best, n / (time.perf_counter() - t0))
    return best


def _count(batches: Iterable) -> int:
    n = 0
    for b in batches:
        n += len(b["episode"]) if isinstance(b, dict) else len(b[0])
    return n


def _cv2_rgb(key: str, data: bytes) -> np.ndarray | None:
    """A webdataset decode handler with the same decoder as ours (module level: it pickles to workers)."""
    if key.endswith(".jpg"):
        return cv2.cvtColor(cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
    if key.endswith(".npy"):
        return npy_load(data)
    return None


def _wds(urls: list[str], decoder: object, *, decode: bool = True):  # noqa: ANN202
    import webdataset as wds

    ds = wds.WebDataset(urls, shardshuffle=len(urls), seed=0, empty_check=False).shuffle(1000)
    if decode:
        return ds.decode(decoder).to_tuple("front.jpg", "wrist.jpg", "state.npy")
    return ds.to_tuple("front.jpg", "wrist.jpg", "state.npy")


def _wds_loader(urls: list[str], decoder: object) -> int:
    import torch

    return _count(torch.utils.data.DataLoader(_wds(urls, decoder), batch_size=BATCH, num_workers=2))


def _jpegs(idx: EpisodeIndex) -> list[tuple[bytes, bytes]]:
    import webdataset as wds

    jpegs = []
    for name in (s.name for s in idx.shards):
        for s in wds.WebDataset(str(idx.root / name), shardshuffle=False, empty_check=False):
            jpegs.append((s["front.jpg"], s["wrist.jpg"]))
    return jpegs


def _ceiling_pass(jpegs: list[tuple[bytes, bytes]], decoder: str = "simplejpeg") -> int:
    """One pass of a bare decode of every frame's two JPEGs on 2 threads, bytes in memory; returns the frames.

    ``decoder``: ``"simplejpeg"`` (libjpeg-turbo called directly, RGB HWC) or ``"cv2"`` (``cv2.imdecode``, BGR HWC)."""
    import simplejpeg

    def turbo(pair: tuple[bytes, bytes]) -> int:
        for data in pair:
            simplejpeg.decode_jpeg(data)
        return 1

    def opencv(pair: tuple[bytes, bytes]) -> int:
        for data in pair:
            cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
        return 1

    with ThreadPoolExecutor(2) as ex:
        return sum(ex.map(turbo if decoder == "simplejpeg" else opencv, jpegs, chunksize=16))


def _reader_only(idx: EpisodeIndex) -> int:
    eps = idx.split("train")
    r = TrainReader(idx, eps, windows=plan_windows(None, None, cameras=set(), arrays=set()), seed=0, rank=0,
                    world_size=1, batch_size=BATCH, epochs=1)
    return sum(1 for _ in r)


WINDOW = {"history": {"state": 2, "front": 2}, "horizon": {"action": 16}}


def _distinct_jpegs(batch: dict) -> int:
    """The distinct (episode, step, camera) JPEGs a batch of the WINDOW pipe shows: front at t-1 (clamped) and
    t, wrist at t."""
    keys = set()
    for e, t in zip(batch["episode"], batch["frame"].tolist()):
        keys.update({(e, t, "wrist"), (e, t, "front"), (e, max(t - 1, 0), "front")})
    return len(keys)


def _timed_pass(pipe, window: bool = False) -> dict:  # noqa: ANN001
    """One pass of ``pipe``: samples/s, camera frames decoded, and (window pipe) distinct JPEGs shown."""
    before, w0 = pipe.stats["frames_decoded"], pipe.stats.get("worker_cpu_us", 0)
    n = distinct = batches = 0
    t0, c0 = time.perf_counter(), _cpu()
    for b in pipe:
        n += len(b["episode"])
        batches += 1
        if window:
            distinct += _distinct_jpegs(b)
    # process workers come from a fork server (not this process's children): their CPU is read from /proc as their
    # pool closes at the pass's end (`_pool.Pool`), and counted here
    t, c = time.perf_counter() - t0, _cpu() - c0 + (pipe.stats.get("worker_cpu_us", 0) - w0) / 1e6
    return {"fps": n / t, "cpu_fps": n / max(c, 1e-9), "jpegs_per_s": (pipe.stats["frames_decoded"] - before) / t,
            "decoded": pipe.stats["frames_decoded"] - before, "distinct": distinct, "batches": batches}


def _cpu() -> float:
    """CPU seconds of this process and its reaped children (not the fork server's decode workers: `_timed_pass`)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _first_batch(idx: EpisodeIndex, method: str) -> float:
    """Seconds from building a train_pipe (index open, imports done) to its first batch."""
    t0 = time.perf_counter()
    pipe = train_pipe(str(idx.root), batch_size=BATCH, seed=0, rank=0, world_size=1, num_workers=2, method=method)
    it = iter(pipe)
    next(it)
    t = time.perf_counter() - t0
    del it
    return t


def _span(values: list[float], fmt: str = "{:.2f}") -> str:
    v = sorted(values)
    return f"{fmt.format(v[len(v) // 2])} (range {fmt.format(v[0])}-{fmt.format(v[-1])} over {len(v)})"


def _grain(workdir: Path, idx: EpisodeIndex, *, episodes: int, length: int) -> Callable[[], dict] | str:
    """One Grain thread-pool epoch over the same JPEG bytes as ``idx`` (a fresh process in Grain's venv, the peers
    section's script), as a callable for `_paired`; or why it cannot run."""
    from benchmarks.bench_peers import _call, make_frames
    from benchmarks.peers.common import JpegDigest

    data, out, log = workdir / "peer-frames", workdir / "grain", workdir / "grain.log"
    make_frames(data, episodes=episodes, length=length)
    c = _call("Grain, thread pool", "convert", data, out, log=log)
    if "error" in c:
        return f"Grain not run: {c['error']}"
    digest = JpegDigest()
    items = [Item(e.id, f) for e in sorted(idx.episodes, key=lambda e: e.id) for f in range(e.length)]
    for r in ShardReader(idx, items):
        for cam in ("front", "wrist"):
            digest.add(bytes(r.members[f"{cam}.jpg"]))
    if digest.hexdigest() != c["jpeg_digest"]:
        return "Grain not run: its JPEG bytes differ from our shards'"

    def epoch() -> dict:
        t = _call("Grain, thread pool", "train", data, out, log=log)
        if "error" in t:
            raise RuntimeError(f"Grain train: {t['error']} (log: {log})")
        return {"fps": t["fps"], "cpu_fps": 1000 / t["cpu_ms_per_frame"]}

    return epoch


def _paired(idx: EpisodeIndex, reps: int, *, window: bool, cv2_ceiling: bool,
            peer: Callable[[], dict] | None = None) -> dict:
    """``reps`` rounds of: the simplejpeg ceiling pass (and the cv2 one), then one epoch of each of our pipes, then
    (``peer``) one epoch of a peer in a fresh process, recorded as run ``"peer"``."""
    jpegs = _jpegs(idx)

    def ours(method: str, **kw: object):  # noqa: ANN202
        return train_pipe(idx, batch_size=BATCH, seed=0, rank=0, world_size=1, num_workers=2, method=method, **kw)

    pipes = {"thread": ours("thread"), "process": ours("process")}
    if window:
        pipes["window"] = ours("thread", **WINDOW)
    for p in pipes.values():  # warm: the first epoch makes the batch buffers every later epoch reuses
        for _ in p:
            pass
    runs: dict[str, list[dict]] = {k: [] for k in pipes}
    ceil: dict[str, list[tuple[float, float]]] = {"simplejpeg": [], "cv2": []}
    for _ in range(reps):
        for dec in ("simplejpeg", "cv2") if cv2_ceiling else ("simplejpeg",):
            t0, c0 = time.perf_counter(), _cpu()
            done = _ceiling_pass(jpegs, dec)
            ceil[dec].append((done / (time.perf_counter() - t0), done / max(_cpu() - c0, 1e-9)))
        for k, p in pipes.items():
            runs[k].append(_timed_pass(p, window=k == "window"))
        if peer is not None:
            runs.setdefault("peer", []).append(peer())
    for p in pipes.values():
        p.shutdown()
    return {"runs": runs, "ceil": ceil, "frames": len(jpegs), "shards": len(idx.shards)}


def _ratios(got: dict, k: str, dec: str = "simplejpeg") -> tuple[list[float], list[float]]:
    """(wall ratios, per-CPU-second ratios) of pipe ``k`` to the ``dec`` ceiling pass run just before it."""
    runs, ceil = got["runs"][k], got["ceil"][dec]
    return [r["fps"] / c[0] for r, c in zip(runs, ceil)], [r["cpu_fps"] / c[1] for r, c in zip(runs, ceil)]


def _mid(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def _pair_note(got: dict, k: str, *, bar: bool = True) -> str:
    wall, cpu = _ratios(got, k)
    ms = [1000 / r["cpu_fps"] for r in got["runs"][k]]
    cms = [1000 / c[1] for c in got["ceil"]["simplejpeg"]]
    text = (f"x the simplejpeg ceiling run just before it {_span(wall)}; per CPU second {_span(cpu)}; CPU "
            f"{_span(ms, '{:.3f}')} ms/frame (ceiling {_span(cms, '{:.3f}')})")
    if got["ceil"]["cv2"]:
        wall, cpu = _ratios(got, k, "cv2")
        text += f"; x the cv2.imdecode ceiling {_span(wall)}, per CPU second {_span(cpu)}"
        text += " (an earlier round's bar against this ceiling: 0.85)" if bar else ""
    return text


def _grain_row(got: dict, grain: object) -> dict:
    row = {"metric": "224x224 footage, threads vs Grain's thread pool", "ours": _mid([r["fps"] for r in got["runs"]
           ["thread"]]), "baseline": None, "ceiling": _mid([c[0] for c in got["ceil"]["simplejpeg"]]),
           "unit": "frames/s"}
    if isinstance(grain, str):
        return {**row, "note": grain}
    peer, ours = got["runs"]["peer"], got["runs"]["thread"]
    per_rep = [o["fps"] / g["fps"] for o, g in zip(ours, peer)]
    cpu = [o["cpu_fps"] / g["cpu_fps"] for o, g in zip(ours, peer)]
    return {**row, "baseline": _mid([g["fps"] for g in peer]),
            "note": f"ours / Grain per rep {_span(per_rep)}, in frames per CPU second {_span(cpu)}; Grain: "
                    f"{_pair_note(got, 'peer', bar=False)}; baseline: Grain 0.2 "
                    "`MapDataset.shuffle().map(cv2 decode)` on `ReadOptions(num_threads=2)` over the same JPEG bytes "
                    "in ArrayRecord files (the peers section's script, a fresh process each rep in Grain's venv; its "
                    "CPU is its whole process tree's after its "
                    "first batch); ours is a built pipe's next epoch"}


def run(workdir: Path, quick: bool) -> dict:
    from benchmarks.footage import shard_footage

    eps, length = (8, 60) if quick else (24, 150)
    reps = 3 if quick else 5
    small = shard_footage(workdir / "footage-224", episodes=eps, length=length, size=(224, 224))
    large = shard_footage(workdir / "footage-480", episodes=max(2, eps // 2), length=length, size=(480, 640))
    generated = make_data(workdir / "train-shards", episodes=eps, length=length)
    grain = _grain(workdir, small, episodes=eps, length=length)
    at224 = _paired(small, reps, window=True, cv2_ceiling=True, peer=None if isinstance(grain, str) else grain)
    at480 = _paired(large, max(2, reps - 2), window=False, cv2_ceiling=False)
    gen = _paired(generated, max(2, reps - 2), window=False, cv2_ceiling=False)
    urls = [str(small.shard_path(i)) for i in range(len(small.shards))]
    repeat = 2 if quick else 3
    first = {m: [_first_batch(small, m) for _ in range(3 if quick else 5)] for m in ("thread", "process")}
    wds_cv2 = _best(lambda: _wds_loader(urls, _cv2_rgb), repeat)
    read_ours = _best(lambda: _reader_only(small), repeat)
    read_wds = _best(lambda: sum(1 for _ in _wds(urls, None, decode=False)), repeat)

    def fps(got: dict, k: str) -> float:
        return _mid([r["fps"] for r in got["runs"][k]])

    def ceiling(got: dict, dec: str = "simplejpeg") -> float:
        return _mid([c[0] for c in got["ceil"][dec]])

    w = at224["runs"]["window"][0]
    jpeg_ratio = [r["jpegs_per_s"] / (2 * c[0]) for r, c in zip(at224["runs"]["window"], at224["ceil"]["simplejpeg"])]
    note = f"{at224['frames']} frames x 2 cameras, {at224['shards']} shards, batch {BATCH}, 2 workers"
    rows = [
        {"metric": "224x224 footage, threads vs wds+DataLoader (cv2 decode)", "ours": fps(at224, "thread"),
         "baseline": wds_cv2, "ceiling": ceiling(at224), "unit": "frames/s",
         "note": f"{note}; {_pair_note(at224, 'thread')} (goal 0.85); baseline: "
                 "WebDataset(shardshuffle).shuffle(1000).decode(cv2) + DataLoader(num_workers=2)"},
        _grain_row(at224, grain),
        {"metric": "224x224 footage, processes", "ours": fps(at224, "process"), "baseline": wds_cv2,
         "ceiling": ceiling(at224), "unit": "frames/s",
         "note": "method='process' (fork-server workers writing into shared batch rows); "
                 + _pair_note(at224, "process")},
        {"metric": "224x224 footage, windows", "ours": fps(at224, "window"), "baseline": None,
         "ceiling": ceiling(at224), "unit": "frames/s",
         "note": "history front 2 + state 2, horizon action 16: three JPEGs per sample instead of two; "
                 f"{_pair_note(at224, 'window')}; in JPEGs decoded/s against the ceiling's {_span(jpeg_ratio)}; per "
                 f"batch {w['distinct'] / w['batches']:.2f} distinct JPEGs shown, {w['decoded'] / w['batches']:.2f} "
                 "decoded"},
        {"metric": "224x224 footage, threads vs the cv2.imdecode ceiling", "ours": fps(at224, "thread"),
         "baseline": None, "ceiling": ceiling(at224, "cv2"), "unit": "frames/s",
         "note": "ceiling: bare cv2.imdecode of the same bytes on 2 threads (what the pipes called before simplejpeg)"},
        {"metric": "480x640 footage, threads", "ours": fps(at480, "thread"), "baseline": None,
         "ceiling": ceiling(at480), "unit": "frames/s",
         "note": f"{at480['frames']} frames; {_pair_note(at480, 'thread')} (goal 0.9)"},
        {"metric": "480x640 footage, processes", "ours": fps(at480, "process"), "baseline": fps(at480, "thread"),
         "ceiling": ceiling(at480), "unit": "frames/s",
         "note": f"{_pair_note(at480, 'process')}; baseline: threads (goal: processes >= threads in frames/s and CPU "
                 "per frame)"},
        {"metric": "224x224 generated frames (second row), threads", "ours": fps(gen, "thread"), "baseline": None,
         "ceiling": ceiling(gen), "unit": "frames/s",
         "note": f"SyntheticReader frames, smoother than footage; {_pair_note(gen, 'thread')}; processes: "
                 f"{_pair_note(gen, 'process')}"},
        {"metric": "read only (no decode): permutation seeks vs wds sequential", "ours": read_ours,
         "baseline": read_wds, "ceiling": None, "unit": "frames/s",
         "note": "224x224 footage; one process; page cache warm; the full shuffle's random reads cost far less than "
                 "decoding"},
        {"metric": "first batch, threads (s from building the pipe)", "ours": _mid(first["thread"]),
         "baseline": None, "ceiling": None, "unit": "s",
         "note": f"{_span(first['thread'], '{:.3f}')} s; imports done before (see peers for a fresh process)"},
        {"metric": "first batch, processes (s from building the pipe)", "ours": _mid(first["process"]),
         "baseline": None, "ceiling": None, "unit": "s",
         "note": f"{_span(first['process'], '{:.3f}')} s; the workers fork at the first next()"},
    ]
    return {"section": "train", "intro": __doc__.split("\n\n", 1)[1].strip(), "rows": rows}


if __name__ == "__main__":
    import json
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        print(json.dumps(run(Path(tmp), "--quick" in sys.argv), indent=1))
