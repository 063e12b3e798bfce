"""A closed render pass against the naive pinned loader that an early-returning `validation_step` skips.

The baseline is a torch ``DataLoader(num_workers=2)`` over the same pinned frames, whose dataset
reads each frame's bytes and decodes it: on a pass that renders nothing, the consumer still iterates
it (Lightning calls ``validation_step`` per batch; the step returns early), so every frame is decoded.
Ours: `video_pipe` with a gate that says "closed". Also the throwaway iterator Lightning creates at
setup: the DataLoader's starts workers that prefetch, ours starts nothing.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from pathlib import Path

import cv2
import numpy as np
import torch

from benchmarks.bench_decode import make_data
from episodepipes.pipes import EpisodeIndex, video_pipe

BATCH = 16


class PinnedFrames(torch.utils.data.Dataset):
    """What a user writes without episodepipes: seek to each frame's bytes, decode every camera."""

    def __init__(self, index: EpisodeIndex, episodes: list[str], counter: object) -> None:
        self.items = [(e, f) for e in episodes for f in range(index.episode(e).length)]
        self.index, self.counter = index, counter

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict:
        import io

        from webdataset.tariterators import tar_file_iterator

        e, f = self.items[i]
        shard, a, b = self.index.episode(e).frame_range(f)
        with open(self.index.shard_path(shard), "rb") as fh:
            fh.seek(a)
            blob = fh.read(b - a)
        out = {"frame": f}
        for m in tar_file_iterator(io.BytesIO(blob)):
            if m["fname"].endswith(".jpg"):
                img = cv2.imdecode(np.frombuffer(m["data"], np.uint8), cv2.IMREAD_COLOR)
                out[m["fname"].split(".")[-2]] = torch.from_numpy(img[:, :, ::-1].transpose(2, 0, 1).copy())
                with self.counter.get_lock():  # type: ignore[attr-defined]
                    self.counter.value += 1  # type: ignore[attr-defined]
        return out


def _validation_step(batch: dict, render: bool) -> None:
    if not render:
        return  # the early return: the batch was already built


def run(workdir: Path, quick: bool) -> dict:
    index = make_data(workdir, quick)
    pinned = [index.episodes[0].id, index.episodes[1].id]
    frames = sum(index.episode(e).length for e in pinned)
    batches = -(-frames // BATCH)
    counter = mp.get_context("fork").Value("l", 0)
    loader = torch.utils.data.DataLoader(PinnedFrames(index, pinned, counter), batch_size=BATCH, num_workers=2,
                                         multiprocessing_context="fork")
    reps = 2 if quick else 3

    base_times = []
    counter.value = 0
    for _ in range(reps):
        t0 = time.perf_counter()
        for b in loader:
            _validation_step(b, render=False)
        base_times.append(time.perf_counter() - t0)
    base_decoded = counter.value // reps

    counter.value = 0
    t0 = time.perf_counter()
    it = iter(loader)  # Lightning's throwaway iterator at setup
    time.sleep(0.5)  # the workers prefetch while the trainer does other setup
    del it
    base_throwaway, base_throwaway_frames = time.perf_counter() - t0 - 0.5, counter.value

    pipe = video_pipe(index, episodes=pinned, batch_size=BATCH, max_batches=batches, gate=lambda: False)
    t0 = time.perf_counter()
    it2 = iter(pipe)
    del it2
    ours_throwaway = time.perf_counter() - t0
    ours_times = []
    for _ in range(max(reps, 200)):
        t0 = time.perf_counter()
        for b in pipe:
            _validation_step(b, render=False)
        ours_times.append(time.perf_counter() - t0)
    closed = dict(pipe.stats)  # before the open pass below
    pipe.gate.bind(lambda: True)  # type: ignore[union-attr]
    t0 = time.perf_counter()
    for b in pipe:
        _validation_step(b, render=True)
    open_time = time.perf_counter() - t0

    base, ours = min(base_times), min(ours_times)
    rows = [
        {"metric": "closed pass time", "ours": ours * 1e3, "baseline": base * 1e3, "ceiling": None, "unit": "ms",
         "note": f"{frames} pinned frames x {len(index.episodes[0].cameras)} cameras; goal >= 1000x cheaper"},
        {"metric": "closed pass frames decoded", "ours": float(closed["frames_decoded"]),
         "baseline": float(base_decoded), "ceiling": None, "unit": "frames",
         "note": f"goal 0; ours also read {closed['bytes_read']} bytes, started {closed['workers_started']} workers"},
        {"metric": "throwaway iterator at setup", "ours": ours_throwaway * 1e3, "baseline": base_throwaway * 1e3,
         "ceiling": None, "unit": "ms",
         "note": f"DataLoader decoded {base_throwaway_frames} frames in the 0.5 s after iter(); ours 0"},
        {"metric": "open (render) pass time", "ours": open_time * 1e3, "baseline": base * 1e3, "ceiling": None,
         "unit": "ms", "note": "same frames decoded; for scale"},
    ]
    return {"section": "gate", "rows": rows,
            "intro": "A validation pass that renders nothing: the pinned loader's cost with a closed gate vs a plain "
                     "DataLoader whose validation_step returns early.",
            "series": {"closed_ms": [t * 1e3 for t in ours_times[:20]], "baseline_ms": [t * 1e3 for t in base_times],
                       "ratio": base / ours}}
