"""Sharding throughput: ``write_shards`` over pre-decoded in-memory frames against ``cv2.imencode`` alone,
and the CLI end to end on a real source folder.

JPEG encoding is the floor of any shard writer, so ``cv2.imencode`` on the same frames in the same
number of processes is the ceiling; one process of it is the baseline a loop over frames would get.
The frames are generated once (in BGR, as OpenCV and PyAV ``bgr24`` decode them) into ``.npy`` files that every
process maps (`CachedReader`: the writer's encoders come from a fork server and inherit nothing, the ceiling's
processes are forked), so neither side pays for making them: the gap is what the writer adds (arrays, tar headers,
transfer to the writing process, sha256, file writes). CPU is the whole process tree's (`peers.common.tree_cpu`).

The ceiling is ``cv2.imencode(".jpg", frame, q90)`` of every camera frame, one episode per task of a
forked ``Pool.imap`` with one OpenCV thread per process, returning only counts. Neither side converts
colours (the frames are BGR, so the writer skips its RGB->BGR step) or resizes. Each write run is
paired with a ceiling run right after it, and the pair with the median ratio is reported. With one worker
the writer appends each episode in a thread while the next is encoded, so that row also gives its CPU-time
ratio: the thread's hashing and writing run beside the encoding, and wall time alone would hide their cost.

End to end: ``python scripts/shard.py write SRC OUT --workers 2`` as a subprocess, on a source folder
made in a temp dir (half the episodes two mp4 cameras, half two PNG image folders, ``arrays.npz``
and ``meta.json`` each), wall time from the command's start until ``index.json`` exists and it exits:
interpreter start, imports, video and PNG decoding, encoding and writing included.

Fleet scale (`benchmarks.shard_fleet`): the in-place merge of 4 synthetic jobs at 10^6-10^8 tiny frames (wall time
and peak RSS of the merge process), the resume saves of one job at 10^5-10^6 tiny frames as a share of its write
(after every shard, ``--save-every 0``, and at the default interval, in the same run), and its writer's RSS per
frame at 10^6-10^7.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from benchmarks.peers.common import tree_cpu  # the encoders are the fork server's children, not ours
from benchmarks.shard_fleet import rows as fleet_rows
from episodepipes.sharding.episode import EpisodeData
from episodepipes.sharding.formats.synthetic import SyntheticReader
from episodepipes.sharding.write import WriteOptions, write_shards

_CACHE: dict[tuple, EpisodeData] = {}  # per process: the episodes' frames, mapped from their files in ``store``


@dataclass(frozen=True)
class CachedReader:
    """``num_episodes`` episodes that reuse the frames of ``synthetic``'s episodes, so many frames cost little memory.

    `make` writes those frames (BGR, as a reader decoding with OpenCV or PyAV yields them) to ``store`` once; every
    process, ours (fork-server encoders) and the baseline's (forked), maps them from there as a reader of a file on
    a warm page cache would, so neither side pays for making frames or gets them for free."""

    synthetic: SyntheticReader
    num_episodes: int
    store: str

    def make(self) -> None:
        for eid in self.synthetic.episode_ids():
            ep = self.synthetic.read(eid)
            for c, frames in ep.cameras.items():
                np.save(Path(self.store) / f"{eid}.{c}.npy", np.stack([cv2.cvtColor(x, cv2.COLOR_RGB2BGR)
                                                                       for x in frames]))

    def episode_ids(self) -> list[str]:
        return [f"ep{i:04d}" for i in range(self.num_episodes)]

    def read(self, episode_id: str) -> EpisodeData:
        src = f"ep{int(episode_id[2:]) % self.synthetic.num_episodes:04d}"
        key = (self.synthetic, src)
        if key not in _CACHE:
            ep = self.synthetic.read(src)  # its frames are generators, never run here: only the arrays are made
            ep.cameras = {c: list(np.load(Path(self.store) / f"{src}.{c}.npy", mmap_mode="r"))
                          for c in self.synthetic.cameras}
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


def _timed(fn: Callable[[], int]) -> tuple[float, float]:
    """(frames per wall second, frames per CPU second) of ``fn``, which returns its frame count."""
    t0, c0 = time.perf_counter(), tree_cpu()
    n = fn()
    return n / (time.perf_counter() - t0), n / max(tree_cpu() - c0, 1e-9)


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


def make_source(dst: Path, *, episodes: int, length: int, height: int = 224, width: int = 224) -> Path:
    """A raw source folder: even episodes as two mp4 cameras, odd ones as two PNG folders."""
    syn = SyntheticReader(num_episodes=episodes, length=length, height=height, width=width)
    for k, eid in enumerate(syn.episode_ids()):
        ep, d = syn.read(eid), dst / eid
        d.mkdir(parents=True, exist_ok=True)
        for cam, frames in ep.cameras.items():
            if k % 2 == 0:
                vw = cv2.VideoWriter(str(d / f"{cam}.mp4"), cv2.VideoWriter_fourcc(*"mp4v"), ep.fps, (width, height))
                for f in frames:
                    vw.write(cv2.cvtColor(f, cv2.COLOR_RGB2BGR))
                vw.release()
            else:
                (d / cam).mkdir(exist_ok=True)
                for i, f in enumerate(frames):
                    cv2.imwrite(str(d / cam / f"{i:06d}.png"), cv2.cvtColor(f, cv2.COLOR_RGB2BGR))
        np.savez(d / "arrays.npz", **ep.arrays)
        (d / "meta.json").write_text(json.dumps({"fps": ep.fps, "prompt": ep.prompt, "split": ep.split}))
    return dst


def cli_write(src: Path, out: Path, workers: int = 2) -> float:
    """Wall seconds of ``scripts/shard.py write SRC OUT --workers N`` from start until it exits with an index."""
    shutil.rmtree(out, ignore_errors=True)
    script = Path(__file__).resolve().parent.parent / "scripts" / "shard.py"
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, str(script), "write", str(src), str(out), "--workers", str(workers)],
                       capture_output=True, text=True)
    t = time.perf_counter() - t0
    if r.returncode or not (out / "index.json").exists():
        raise RuntimeError(f"shard.py write failed ({r.returncode}): {r.stderr.strip()[-500:]}")
    return t


def run(workdir: Path, quick: bool) -> dict:
    eps, length = (12, 40) if quick else (48, 50)
    syn = SyntheticReader(num_episodes=4, length=length, height=224, width=224)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "frames").mkdir(exist_ok=True)
    reader = CachedReader(syn, eps, str(workdir / "frames"))
    reader.make()
    reps = 1 if quick else 7
    two = _paired(lambda: _write(reader, workdir / "w2", 2), lambda: _imencode(reader, 2), reps,
                  lambda: shutil.rmtree(workdir / "w2", ignore_errors=True))
    one = _paired(lambda: _write(reader, workdir / "w1", 1), lambda: _imencode(reader, 1), max(1, reps // 2),
                  lambda: shutil.rmtree(workdir / "w1", ignore_errors=True))
    mid2, mid1 = two[len(two) // 2], one[len(one) // 2]
    frames = eps * length * len(syn.cameras)
    what = f"{frames} camera frames 224x224 BGR, 2 cameras, JPEG q90"
    src_eps, src_len = (4, 30) if quick else (12, 100)
    src = make_source(workdir / "src", episodes=src_eps, length=src_len)
    cli = sorted(cli_write(src, workdir / "cli-out") for _ in range(1 if quick else 3))
    cli_frames = src_eps * src_len * 2
    src_bytes = sum(p.stat().st_size for p in src.rglob("*") if p.is_file())
    rows = [
        {"metric": "CLI end to end: shard.py write SRC OUT --workers 2 (mp4 + PNG source)",
         "ours": cli_frames / cli[len(cli) // 2], "baseline": None, "ceiling": None, "unit": "frames/s",
         "note": f"{src_eps} episodes x {src_len} frames x 2 cameras 224x224 (half mp4, half PNG, "
                 f"{src_bytes / 1e6:.1f} MB); wall {cli[len(cli) // 2]:.2f} s from start to index (median of "
                 f"{len(cli)}, range {cli[0]:.2f}-{cli[-1]:.2f} s), interpreter start and imports included"},
        {"metric": "write_shards over pre-decoded in-memory frames, 2 workers, vs imencode in 2 processes",
         "ours": mid2[0], "baseline": mid1[1],
         "ceiling": mid2[1], "unit": "frames/s",
         "note": f"{what}; ratio to ceiling {_ratios(two, 0, 1)} (goal 0.8); baseline: imencode in 1"},
        {"metric": "write_shards over pre-decoded in-memory frames, 1 worker, vs imencode in 1 process",
         "ours": mid1[0], "baseline": None,
         "ceiling": mid1[1], "unit": "frames/s",
         "note": f"ratio {_ratios(one, 0, 1)}; CPU-time ratio {_ratios(one, 2, 3)} (appending in a thread)"},
        {"metric": "CPU cost: write_shards (pre-decoded frames), 2 workers, vs imencode in 2 processes",
         "ours": mid2[2], "baseline": None,
         "ceiling": mid2[3], "unit": "frames/s (CPU time)",
         "note": f"ratio {_ratios(two, 2, 3)}; CPU time moves less than wall time with other load, but it moves"},
    ]
    shutil.rmtree(workdir / "w1", ignore_errors=True)
    shutil.rmtree(workdir / "w2", ignore_errors=True)
    shutil.rmtree(workdir / "cli-out", ignore_errors=True)
    _CACHE.clear()
    rows += fleet_rows(workdir / "fleet", quick)  # the merge and resume-save bookkeeping at 1e5..1e8 frames
    return {"section": "shard", "intro": __doc__.split("\n\n", 1)[1].strip(), "rows": rows}


if __name__ == "__main__":
    import json
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        print(json.dumps(run(Path(tmp), "--quick" in sys.argv), indent=1))
