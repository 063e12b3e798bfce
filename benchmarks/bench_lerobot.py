"""Sharding a LeRobot v3.0 dataset: camera frames/s, against PyAV decoding the same mp4 files alone.

Decoding is the floor of any import, so PyAV's own decode rate is the ceiling. The reader row shows
what timestamp matching and seeking into multi-episode files cost; the shard rows add JPEG encoding
and tar writing (`write_shards`, the code behind ``shard.py write --format lerobot``).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import av

from benchmarks.lerobot_data import available_encoders, make_lerobot
from episodepipes.sharding.lerobot import LeRobotReader
from episodepipes.sharding.write import WriteOptions, write_shards


def _pyav_decode(root: Path) -> int:
    frames = 0
    for path in sorted((root / "videos").rglob("*.mp4")):
        with av.open(str(path)) as c:
            stream = c.streams.video[0]
            stream.thread_type = "AUTO"
            for f in c.decode(stream):
                f.to_ndarray(format="rgb24")
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


def run(workdir: Path, quick: bool) -> dict:
    encoder = available_encoders()[0]
    eps, length, (h, w) = (4, 40, (96, 128)) if quick else (12, 150, (240, 320))
    src = workdir / "lerobot"
    shutil.rmtree(src, ignore_errors=True)
    make_lerobot(src, num_episodes=eps, length=length, height=h, width=w, fps=30, encoder=encoder,
                 episodes_per_file=4, image_feature=False)
    reader = LeRobotReader(src)
    _pyav_decode(src)  # warm the page cache, so neither side pays for the first read
    n_dec, t_dec = _timed(_pyav_decode, src)
    n_read, t_read = _timed(_reader_decode, reader)
    rows = [{"metric": "decode: reader vs PyAV alone", "ours": n_read / t_read, "baseline": None,
             "ceiling": n_dec / t_dec, "unit": "frames/s",
             "note": f"{n_read} frames, {eps} episodes, {h}x{w}, {encoder}, 4 episodes per mp4"}]
    for workers in (1, 2):
        out = workdir / f"shards-{workers}"
        shutil.rmtree(out, ignore_errors=True)
        t0 = time.perf_counter()
        res = write_shards(reader, out, WriteOptions(format="lerobot", shard_size=64 * 10**6), workers=workers)
        t = time.perf_counter() - t0
        cams = len(reader.video_keys)
        rows.append({"metric": f"shard --format lerobot, {workers} worker(s)", "ours": res.frames * cams / t,
                     "baseline": None, "ceiling": n_dec / t_dec, "unit": "frames/s",
                     "note": f"camera frames/s incl. JPEG q90 + tar; {res.frames} samples x {cams} cameras"})
    return {"section": "lerobot", "intro": __doc__.split("\n\n", 1)[1].strip(), "rows": rows}


if __name__ == "__main__":
    import json
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        print(json.dumps(run(Path(tmp), "--quick" in sys.argv), indent=1))
