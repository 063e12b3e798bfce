"""Sharding a LeRobot v3.0 dataset: camera frames/s, against PyAV decoding the same mp4 files alone.

Decoding is the floor of any import, so PyAV's own decode rate (with one RGB conversion context per file, as the
reader has) is the ceiling. The reader row shows what timestamp matching and seeking into multi-episode files
cost; the JPEG shard rows add JPEG encoding and tar writing (`write_shards`, the code behind ``shard.py write
--format lerobot``). The copy rows (``--codec copy``) decode nothing: they copy each episode's packets and are
compared with the JPEG import at the same worker count. Every figure is the median over rounds that run each
row once in turn (so a busy moment hits all of them alike), with the range of the per-round ratios in the note.
"""

from __future__ import annotations

import shutil
import statistics
import time
from pathlib import Path

import av
from av.video.reformatter import VideoReformatter

from benchmarks.lerobot_data import available_encoders, make_lerobot
from episodepipes.sharding.lerobot import LeRobotReader
from episodepipes.sharding.write import WriteOptions, write_shards


def _pyav_decode(root: Path) -> int:
    frames = 0
    for path in sorted((root / "videos").rglob("*.mp4")):
        with av.open(str(path)) as c:
            stream = c.streams.video[0]
            stream.thread_type = "AUTO"
            rgb = VideoReformatter()
            for f in c.decode(stream):
                rgb.reformat(f, format="rgb24").to_ndarray()
                frames += 1
    return frames


def _reader_decode(reader: LeRobotReader) -> int:
    frames = 0
    for eid in reader.episode_ids():
        for cam in reader.read(eid).cameras.values():
            frames += sum(1 for _ in cam)
    return frames


def _timed(fn, *args) -> tuple[int, float]:  # noqa: ANN001
    t0 = time.perf_counter()
    n = fn(*args)
    return n, time.perf_counter() - t0


def _write(reader: LeRobotReader, out: Path, codec: str, workers: int) -> tuple[int, float]:
    """(camera frames, seconds) of one write of the whole dataset; the output's bytes are kept in ``out``."""
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    res = write_shards(reader, out, WriteOptions(format="lerobot", shard_size=64 * 10**6, codec=codec),
                       workers=workers)
    return res.frames * len(reader.video_keys), time.perf_counter() - t0


def _spread(xs: list[float]) -> str:
    return f"{min(xs):.2f}-{max(xs):.2f}x over {len(xs)} rounds"


def run(workdir: Path, quick: bool) -> dict:
    encoder = available_encoders()[0]
    eps, length, (h, w), rounds = (4, 40, (96, 128), 2) if quick else (12, 150, (240, 320), 3)
    src = workdir / "lerobot"
    shutil.rmtree(src, ignore_errors=True)
    make_lerobot(src, num_episodes=eps, length=length, height=h, width=w, fps=30, encoder=encoder,
                 episodes_per_file=4, image_feature=False)
    reader, copier = LeRobotReader(src), LeRobotReader(src, copy=True)
    _pyav_decode(src)  # warm the page cache, so neither side pays for the first read
    jobs = {"pyav": lambda: _timed(_pyav_decode, src), "reader": lambda: _timed(_reader_decode, reader)}
    for workers in (1, 2):
        for codec, r in (("jpeg", reader), ("copy", copier)):
            jobs[f"{codec}-{workers}"] = lambda r=r, c=codec, k=workers: _write(r, workdir / f"{c}-{k}", c, k)
    fps: dict[str, list[float]] = {k: [] for k in jobs}
    for _ in range(rounds):
        for name, job in jobs.items():
            n, t = job()
            fps[name].append(n / t)
    med = {k: statistics.median(v) for k, v in fps.items()}

    def ratios(a: str, b: str) -> list[float]:
        return [x / y for x, y in zip(fps[a], fps[b])]

    n = eps * length * len(reader.video_keys)
    rows = [{"metric": "decode: reader vs PyAV alone", "ours": med["reader"], "baseline": None,
             "ceiling": med["pyav"], "unit": "frames/s",
             "note": f"{n} frames, {eps} episodes, {h}x{w}, {encoder}, 4 episodes per mp4; "
                     f"{_spread(ratios('reader', 'pyav'))}"}]
    for workers in (1, 2):
        rows.append({"metric": f"shard --format lerobot (JPEG), {workers} worker(s)", "ours": med[f"jpeg-{workers}"],
                     "baseline": None, "ceiling": med["pyav"], "unit": "frames/s",
                     "note": "camera frames/s incl. decode, JPEG q90 + tar; "
                             f"{_spread(ratios(f'jpeg-{workers}', 'pyav'))}"})
    for workers in (1, 2):
        rows.append({"metric": f"shard --format lerobot --codec copy, {workers} worker(s)",
                     "ours": med[f"copy-{workers}"], "baseline": med[f"jpeg-{workers}"], "ceiling": med["pyav"],
                     "unit": "frames/s", "note": f"baseline: the JPEG import with {workers} worker(s); "
                                                 f"{_spread(ratios(f'copy-{workers}', f'jpeg-{workers}'))}"})
    size = {c: sum(p.stat().st_size for p in (workdir / f"{c}-1").glob("*.tar")) for c in ("jpeg", "copy")}
    source = sum(p.stat().st_size for p in (src / "videos").rglob("*.mp4"))
    rows.append({"metric": "shard bytes: --codec copy vs JPEG q90", "ours": size["copy"], "baseline": size["jpeg"],
                 "ceiling": None, "unit": "bytes", "note": f"the source mp4s hold {source:,} bytes"})
    return {"section": "lerobot", "intro": __doc__.split("\n\n", 1)[1].strip(), "rows": rows}


if __name__ == "__main__":
    import json
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        print(json.dumps(run(Path(tmp), "--quick" in sys.argv), indent=1))
