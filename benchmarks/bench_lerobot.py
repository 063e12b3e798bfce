"""Sharding a LeRobot v3.0 dataset: camera frames/s, against PyAV decoding the same mp4 files alone.

Decoding is the floor of any import, so PyAV's own decode rate (with one RGB conversion context per file, as the
reader has) is the ceiling. The reader row shows what timestamp matching and seeking into multi-episode files
cost; the JPEG shard rows add JPEG encoding and tar writing (`write_shards`, the code behind ``shard.py write
--format lerobot``). The copy rows (``--codec copy``) decode nothing: they copy each episode's packets and are
compared with the JPEG import at the same worker count, on the same dataset and on one with 4x the episodes (so
a run's fixed costs, the index and statistics files, weigh less). Rounds run each row once in turn, alternating
which import goes first (so a busy moment hits both alike); a copy import, 15-20x shorter than the JPEG one, runs
three times per round and its median counts. The ratio is the median of the per-round ratios, with their range;
the CPU-time ratio (frames per CPU second of the process and its children) beside it is the figure load disturbs
least. The CLI row times ``shard.py write`` itself on the larger dataset, in a fresh interpreter from its start to
its index, as a user waits for it. The parity row (`benchmarks.lerobot_parity`) compares the copy import's
frames with what LeRobot's own loader returns for a dataset its own writer made.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import av
from av.video.reformatter import VideoReformatter

from benchmarks import lerobot_parity
from benchmarks.lerobot_data import available_encoders, make_lerobot
from benchmarks.peers.common import tree_cpu  # the encoders are the fork server's children, not ours
from episodepipes.sharding.formats.lerobot import LeRobotReader
from episodepipes.sharding.write import WriteOptions, write_shards

ROOT = Path(__file__).resolve().parent.parent


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


def _write(reader: LeRobotReader, out: Path, codec: str, workers: int) -> tuple[int, float, float]:
    """(camera frames, seconds, CPU seconds) of one write of the whole dataset; the output is kept in ``out``."""
    shutil.rmtree(out, ignore_errors=True)
    c0, t0 = tree_cpu(), time.perf_counter()
    res = write_shards(reader, out, WriteOptions(format="lerobot", shard_size=64 * 10**6, codec=codec),
                       workers=workers)
    return res.frames * len(reader.video_keys), time.perf_counter() - t0, tree_cpu() - c0


def _cli(src: Path, out: Path, codec: str, pycache: Path) -> float:
    """Seconds of one ``shard.py write`` in a fresh interpreter, from its start to its index (what a user waits).

    Bytecode is cached (in ``pycache``) even where the environment says not to write it, as an installed package
    has it: compiling every module again at each start is not what a user's import pays.
    """
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(pycache)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, str(ROOT / "scripts" / "shard.py"), "write", str(src), str(out), "--format",
                    "lerobot", "--codec", codec, "--workers", "2", "--overwrite"], check=True, cwd=ROOT, env=env,
                   capture_output=True)
    return time.perf_counter() - t0


def _spread(xs: list[float]) -> str:
    return f"{min(xs):.2f}-{max(xs):.2f}x over {len(xs)} rounds"


def _imports(src: Path, work: Path, rounds: int, reps: int) -> dict[str, list[tuple[float, float]]]:
    """Per "jpeg-K"/"copy-K": (frames/s, frames per CPU second) of each round; a copy's is its median of ``reps``."""
    reader, copier = LeRobotReader(src), LeRobotReader(src, copy=True)
    out: dict[str, list[tuple[float, float]]] = {f"{c}-{k}": [] for k in (1, 2) for c in ("jpeg", "copy")}
    for r in range(rounds):
        for workers in (1, 2):
            for codec in (("jpeg", "copy") if (r + workers) % 2 else ("copy", "jpeg")):
                runs = [_write(reader if codec == "jpeg" else copier, work / f"{codec}-{workers}", codec, workers)
                        for _ in range(1 if codec == "jpeg" else reps)]
                n, t, cpu = sorted(runs, key=lambda x: x[1])[len(runs) // 2]
                out[f"{codec}-{workers}"].append((n / t, n / cpu))
    return out


def _copy_rows(fps: dict[str, list[tuple[float, float]]], label: str) -> list[dict]:
    rows = []
    for workers in (1, 2):
        copy, jpeg = fps[f"copy-{workers}"], fps[f"jpeg-{workers}"]
        wall = [c[0] / j[0] for c, j in zip(copy, jpeg)]
        cpu = [c[1] / j[1] for c, j in zip(copy, jpeg)]
        rows.append({"metric": f"shard --format lerobot --codec copy, {workers} worker(s), {label}",
                     "ours": statistics.median(c[0] for c in copy), "baseline": statistics.median(j[0] for j in jpeg),
                     "ceiling": None, "unit": "frames/s",
                     "note": f"baseline: the JPEG import with {workers} worker(s) on the same data; ratio "
                             f"{statistics.median(wall):.2f}x (median of paired rounds, {_spread(wall)}); in CPU "
                             f"time {statistics.median(cpu):.2f}x ({_spread(cpu)}) (goal 10x)"})
    return rows


def run(workdir: Path, quick: bool) -> dict:
    encoder = available_encoders()[0]
    eps, length, (h, w), rounds = (4, 40, (96, 128), 2) if quick else (12, 150, (240, 320), 5)
    src, big = workdir / "lerobot", workdir / "lerobot-4x"
    for root, n in ((src, eps), (big, 4 * eps)):
        shutil.rmtree(root, ignore_errors=True)
        make_lerobot(root, num_episodes=n, length=length, height=h, width=w, fps=30, encoder=encoder,
                     episodes_per_file=4, image_feature=False)
    reader = LeRobotReader(src)
    _pyav_decode(src)  # warm the page cache, so neither side pays for the first read
    dec: dict[str, list[float]] = {"pyav": [], "reader": []}
    for _ in range(rounds):
        for name, job in (("pyav", lambda: _timed(_pyav_decode, src)), ("reader", lambda: _timed(_reader_decode,
                                                                                                 reader))):
            n, t = job()
            dec[name].append(n / t)
    fps = _imports(src, workdir, rounds, 3)
    _pyav_decode(big)
    fps_big = _imports(big, workdir, max(2, rounds - 2), 3)
    cli: dict[str, list[float]] = {"jpeg": [], "copy": []}
    _cli(src, workdir / "cli-warm", "copy", workdir / "pycache")  # compiles and caches the bytecode
    for r in range(max(2, rounds - 2)):
        for codec in ("jpeg", "copy") if r % 2 else ("copy", "jpeg"):
            cli[codec].append(_cli(big, workdir / f"cli-{codec}", codec, workdir / "pycache"))
    pyav = statistics.median(dec["pyav"])
    n = eps * length * len(reader.video_keys)
    rows = [{"metric": "decode: reader vs PyAV alone", "ours": statistics.median(dec["reader"]), "baseline": None,
             "ceiling": pyav, "unit": "frames/s",
             "note": f"{n} frames, {eps} episodes, {h}x{w}, {encoder}, 4 episodes per mp4; "
                     f"{_spread([a / b for a, b in zip(dec['reader'], dec['pyav'])])}"}]
    for workers in (1, 2):
        jpeg = [x[0] for x in fps[f"jpeg-{workers}"]]
        rows.append({"metric": f"shard --format lerobot (JPEG), {workers} worker(s)", "ours": statistics.median(jpeg),
                     "baseline": None, "ceiling": pyav, "unit": "frames/s",
                     "note": "camera frames/s incl. decode, JPEG q90 + tar; "
                             f"{_spread([a / b for a, b in zip(jpeg, dec['pyav'])])}"})
    rows += _copy_rows(fps, f"{n:,} frames")
    rows += _copy_rows(fps_big, f"{4 * n:,} frames ({4 * eps} episodes)")
    wall = [j / c for c, j in zip(cli["copy"], cli["jpeg"])]
    rows.append({"metric": f"shard.py write --codec copy (CLI, start to index), 2 workers, {4 * n:,} frames",
                 "ours": 4 * n / statistics.median(cli["copy"]), "baseline": 4 * n / statistics.median(cli["jpeg"]),
                 "ceiling": None, "unit": "frames/s",
                 "note": f"baseline: the same command with the JPEG codec; each in a fresh interpreter, its start and "
                         f"imports (bytecode cached) included; ratio {statistics.median(wall):.2f}x ({_spread(wall)})"})
    size = {c: sum(p.stat().st_size for p in (workdir / f"{c}-1").glob("*.tar")) for c in ("jpeg", "copy")}
    source = sum(p.stat().st_size for p in (big / "videos").rglob("*.mp4"))
    rows.append({"metric": f"shard bytes: --codec copy vs JPEG q90 ({4 * eps} episodes)", "ours": size["copy"],
                 "baseline": size["jpeg"], "ceiling": None, "unit": "bytes",
                 "note": f"the source mp4s hold {source:,} bytes"})
    rows += lerobot_parity.rows(workdir)
    return {"section": "lerobot", "intro": __doc__.split("\n\n", 1)[1].strip(), "rows": rows}


if __name__ == "__main__":
    import json
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        print(json.dumps(run(Path(tmp), "--quick" in sys.argv), indent=1))
