"""Sharding throughput: camera frames/s of ``shard.py write --workers 2`` against ``cv2.imencode`` alone.

JPEG encoding is the floor of any shard writer, so ``cv2.imencode`` on the same frames in the same
number of processes is the ceiling; one process of it is the baseline a loop over frames would get.
The frames are generated once (in BGR, as OpenCV and PyAV ``bgr24`` decode them) and cached before
the processes fork, so neither side pays for making them: the gap is what the writer adds (arrays,
tar headers, transfer to the writing process, sha256, file writes).

The ceiling is ``cv2.imencode(".jpg", frame, q90)`` of every camera frame, one episode per task of a
forked ``Pool.imap`` with one OpenCV thread per process, returning only counts. Neither side converts
colours (the frames are BGR, so the writer skips its RGB->BGR step) or resizes. Each write run is
paired with a ceiling run right after it, and the pair with the median ratio is reported.
"""

from __future__ import annotations

import multiprocessing as mp
import resource
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import cv2

from episodepipes.sharding.episode import EpisodeData
from episodepipes.sharding.synthetic import SyntheticReader
from episodepipes.sharding.write import WriteOptions, write_shards

_CACHE: dict[tuple, EpisodeData] = {}  # filled in the parent, inherited by forked workers


@dataclass(frozen=True)
class CachedReader:
    """``num_episodes`` episodes that reuse the frames of ``synthetic``'s episodes, made once per process
    (and, when warmed, before fork), so many frames cost little memory."""

    synthetic: SyntheticReader
    num_episodes: int

    def episode_ids(self) -> list[str]:
        return [f"ep{i:04d}" for i in range(self.num_episodes)]

    def read(self, episode_id: str) -> EpisodeData:
        key = (self.synthetic, f"ep{int(episode_id[2:]) % self.synthetic.num_episodes:04d}")
        if key not in _CACHE:
            ep = self.synthetic.read(key[1])
            # stored BGR, as a reader decoding with OpenCV or PyAV (bgr24) yields them
            ep.cameras = {c: [cv2.cvtColor(x, cv2.COLOR_RGB2BGR) for x in f] for c, f in ep.cameras.items()}
            _CACHE[key] = ep
        ep = _CACHE[key]
        return EpisodeData(episode_id, dict(ep.cameras), dict(ep.arrays), ep.fps, ep.prompt, ep.split,
                           channel_order="bgr")


def _imencode_episode(task: tuple[CachedReader, str]) -> int:
    reader, eid = task
    n = 0
    for frames in reader.read(eid).cameras.values():
        for f in frames:
            ok, _ = cv2.imencode(".jpg", f, [cv2.IMWRITE_JPEG_QUALITY, 90])
            n += int(ok)
    return n


def _cpu() -> float:
    """CPU seconds of this process and its reaped children: unlike wall time, other users' load
    on a shared machine does not change it."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _timed(fn: Callable[[], int]) -> tuple[float, float]:
    """(frames per wall second, frames per CPU second) of ``fn``, which returns its frame count."""
    t0, c0 = time.perf_counter(), _cpu()
    n = fn()
    return n / (time.perf_counter() - t0), n / max(_cpu() - c0, 1e-9)


def _imencode(reader: CachedReader, processes: int) -> int:
    tasks = [(reader, e) for e in reader.episode_ids()]
    if processes == 1:
        return sum(map(_imencode_episode, tasks))
    threads = cv2.getNumThreads()
    cv2.setNumThreads(1)  # inherited by the forked children, as write_shards's encoders get it
    try:
        pool = mp.get_context("fork").Pool(processes)
    finally:
        cv2.setNumThreads(threads)
    with pool:
        return sum(pool.imap(_imencode_episode, tasks))


def _write(reader: CachedReader, out: Path, workers: int) -> int:
    res = write_shards(reader, out, WriteOptions(format="synthetic", shard_size=64 * 10**6), workers=workers)
    return res.frames * len(reader.synthetic.cameras)


def _paired(ours: Callable[[], int], ref: Callable[[], int], reps: int,
            cleanup: Callable[[], None] | None = None) -> list[tuple[float, float, float, float]]:
    """(ours wall, ref wall, ours CPU, ref CPU) frames/s of ``reps`` back-to-back pairs, sorted by wall ratio.

    Another job on a shared 2-core machine can take a core for seconds; runs side by side see the same
    machine, so their ratio is steadier than the ratio of separately best rates.
    """
    pairs = []
    for _ in range(reps):
        if cleanup is not None:
            cleanup()  # outside the timing: deleting the last run's output is not part of writing
        (w, c), (rw, rc) = _timed(ours), _timed(ref)
        pairs.append((w, rw, c, rc))
    return sorted(pairs, key=lambda p: p[0] / p[1])


def _ratios(pairs: list[tuple[float, ...]], a: int, b: int) -> str:
    r = sorted(p[a] / p[b] for p in pairs)
    return f"{r[len(r) // 2]:.2f} (range {r[0]:.2f}-{r[-1]:.2f} over {len(r)} pairs)"


def run(workdir: Path, quick: bool) -> dict:
    eps, length = (12, 40) if quick else (48, 50)
    syn = SyntheticReader(num_episodes=4, length=length, height=224, width=224)
    reader = CachedReader(syn, eps)
    for eid in reader.episode_ids():  # make every frame before any fork
        reader.read(eid)
    workdir.mkdir(parents=True, exist_ok=True)
    reps = 1 if quick else 7
    two = _paired(lambda: _write(reader, workdir / "w2", 2), lambda: _imencode(reader, 2), reps,
                  lambda: shutil.rmtree(workdir / "w2", ignore_errors=True))
    one = _paired(lambda: _write(reader, workdir / "w1", 1), lambda: _imencode(reader, 1), max(1, reps // 2),
                  lambda: shutil.rmtree(workdir / "w1", ignore_errors=True))
    mid2, mid1 = two[len(two) // 2], one[len(one) // 2]
    frames = eps * length * len(syn.cameras)
    what = f"{frames} camera frames 224x224 BGR, 2 cameras, JPEG q90"
    rows = [
        {"metric": "write --workers 2 vs imencode in 2 processes", "ours": mid2[0], "baseline": mid1[1],
         "ceiling": mid2[1], "unit": "frames/s",
         "note": f"{what}; ratio to ceiling {_ratios(two, 0, 1)} (goal 0.8); baseline: imencode in 1"},
        {"metric": "write --workers 1 vs imencode in 1 process", "ours": mid1[0], "baseline": None,
         "ceiling": mid1[1], "unit": "frames/s", "note": f"ratio {_ratios(one, 0, 1)}"},
        {"metric": "CPU cost: write --workers 2 vs imencode in 2 processes", "ours": mid2[2], "baseline": None,
         "ceiling": mid2[3], "unit": "frames/s (CPU time)",
         "note": f"ratio {_ratios(two, 2, 3)}; CPU time moves less than wall time with other load, but it moves"},
    ]
    shutil.rmtree(workdir / "w1", ignore_errors=True)
    shutil.rmtree(workdir / "w2", ignore_errors=True)
    _CACHE.clear()
    return {"section": "shard", "intro": __doc__.split("\n\n", 1)[1].strip(), "rows": rows}


if __name__ == "__main__":
    import json
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        print(json.dumps(run(Path(tmp), "--quick" in sys.argv), indent=1))
