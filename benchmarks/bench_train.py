"""Training reads: shuffled frames/s of `train_pipe` vs webdataset shard shuffle + buffer, and the decode ceiling.

`train_pipe` reads a planned per-epoch permutation by seeking through the byte-range index: a full
shuffle whose resume state is a cursor. The usual alternative is webdataset's shard shuffle plus a
bounded buffer (``.shuffle(1000)``), which reads sequentially but only mixes frames within the buffer.
The read-only rows show what the random seeks cost; the ceiling is bare ``cv2.imdecode`` of the same
JPEGs on 2 threads, bytes already in memory. A sample is one frame of two 224x224 cameras.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import cv2
import numpy as np

from episodepipes.format import npy_load
from episodepipes.index import EpisodeIndex
from episodepipes.pipes.train import TrainReader, train_pipe
from episodepipes.pipes.window import plan_windows
from episodepipes.sharding.encode import EncodeOptions, encode_episode
from episodepipes.sharding.synthetic import SyntheticReader
from episodepipes.sharding.writer import ShardWriter

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


def _ceiling(idx: EpisodeIndex) -> float:
    import webdataset as wds

    jpegs = []
    for name in (s.name for s in idx.shards):
        for s in wds.WebDataset(str(idx.root / name), shardshuffle=False, empty_check=False):
            jpegs.append((s["front.jpg"], s["wrist.jpg"]))

    def decode(pair: tuple[bytes, bytes]) -> int:
        for data in pair:
            cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
        return 1

    def run() -> int:
        with ThreadPoolExecutor(2) as ex:
            return sum(ex.map(decode, jpegs, chunksize=16))

    return _best(run, 2)


def _reader_only(idx: EpisodeIndex) -> int:
    eps = idx.split("train")
    r = TrainReader(idx, eps, windows=plan_windows(None, None, cameras=set(), arrays=set()), seed=0, rank=0,
                    world_size=1, batch_size=BATCH, epochs=1)
    return sum(1 for _ in r)


def run(workdir: Path, quick: bool) -> dict:
    eps, length = (8, 60) if quick else (24, 150)
    idx = make_data(workdir / "train-shards", episodes=eps, length=length)
    urls = [str(idx.shard_path(i)) for i in range(len(idx.shards))]
    frames = sum(e.length for e in idx.episodes)
    repeat = 2 if quick else 3

    def ours(method: str, **kw: object) -> float:
        pipe = train_pipe(idx, batch_size=BATCH, seed=0, rank=0, world_size=1, num_workers=2, method=method, **kw)
        return _best(lambda: _count(pipe), repeat)  # each pass is the next epoch: a new order every run

    ceiling = _ceiling(idx)
    thread = ours("thread")
    wds_cv2 = _best(lambda: _wds_loader(urls, _cv2_rgb), repeat)
    wds_pil = _best(lambda: _wds_loader(urls, "rgb8"), repeat)
    read_ours = _best(lambda: _reader_only(idx), repeat)
    read_wds = _best(lambda: sum(1 for _ in _wds(urls, None, decode=False)), repeat)
    note = f"{frames} frames x 2 cameras 224x224, {len(urls)} shards, batch {BATCH}, 2 workers"
    rows = [
        {"metric": "train frames/s, threads vs wds+DataLoader (cv2 decode)", "ours": thread,
         "baseline": wds_cv2, "ceiling": ceiling, "unit": "frames/s",
         "note": f"{note}; baseline: WebDataset(shardshuffle).shuffle(1000).decode(cv2) + DataLoader(num_workers=2)"},
        {"metric": "train frames/s, threads vs wds+DataLoader (decode('rgb8'))", "ours": thread,
         "baseline": wds_pil, "ceiling": ceiling, "unit": "frames/s", "note": "baseline decodes with PIL, its default"},
        {"metric": "train frames/s, processes", "ours": ours("process"), "baseline": wds_cv2, "ceiling": ceiling,
         "unit": "frames/s", "note": "method='process': forked decode workers, samples pickled back"},
        {"metric": "train frames/s, windows", "ours": ours("thread", history={"state": 2, "front": 2},
                                                          horizon={"action": 16}),
         "baseline": None, "ceiling": ceiling, "unit": "frames/s",
         "note": "history front 2 + state 2, horizon action 16: three JPEGs per sample instead of two"},
        {"metric": "read only (no decode): permutation seeks vs wds sequential", "ours": read_ours,
         "baseline": read_wds, "ceiling": None, "unit": "frames/s",
         "note": "one process; page cache warm; the full shuffle's random reads cost far less than decoding"},
    ]
    return {"section": "train", "intro": __doc__.split("\n\n", 1)[1].strip(), "rows": rows}


if __name__ == "__main__":
    import json
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        print(json.dumps(run(Path(tmp), "--quick" in sys.argv), indent=1))
