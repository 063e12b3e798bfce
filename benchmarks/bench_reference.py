"""A LeRobot dataset read in place (``write --codec reference``) against it imported with ``--codec copy``.

The dataset is the lerobot section's (`benchmarks.lerobot_data`, AV1 at LeRobot's defaults, several episodes per
mp4). Rows: indexing frames/s (the whole call, index written) against the copy import with one worker; `train_pipe`
frames/s on the in-place index against the copy-imported shards (same options: batch 32, 2 decode threads, one
epoch, shuffled), alternating which goes first, median of rounds; and the bytes written (index, columns, statistics,
pieces, literal bytes and rows, each's bytes a frame) against the dataset's bytes, at the section's size and at
LeRobot's usual 480x640. Against LeRobotDataset's own loader on the same files and windows
(`benchmarks.lerobot_windows`, in the peers' lerobot venv): frames/s, the first batch's time, and the window images
compared sample by sample. From an object store (`benchmarks.lerobot_s3`): the bytes fetched against the packets
the batches decode.
"""

from __future__ import annotations

import shutil
import statistics
import time
from pathlib import Path

from benchmarks import lerobot_s3, lerobot_windows
from benchmarks.lerobot_data import available_encoders, make_lerobot
from episodepipes.index import EpisodeIndex
from episodepipes.pipes.train import train_pipe
from episodepipes.sharding.formats.lerobot import LeRobotReader
from episodepipes.sharding.formats.lerobot_ref import index_lerobot
from episodepipes.sharding.write import WriteOptions, write_shards

BATCH = 32


def _dataset_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def _index_times(src: Path, work: Path, rounds: int) -> tuple[list[float], list[float], int]:
    """Seconds per round of the copy import (1 worker) and of the reference index, which goes first alternately;
    the frames. A first round of each, untimed, pays the imports and warms the page cache."""
    copy, ref, frames = [], [], 0
    for r in range(-1, rounds):
        for kind in (("copy", "ref") if r % 2 else ("ref", "copy")):
            out = work / f"idx-{kind}"
            shutil.rmtree(out, ignore_errors=True)
            t0 = time.perf_counter()
            if kind == "copy":
                frames = write_shards(LeRobotReader(src, copy=True), out, WriteOptions(
                    format="lerobot", shard_size=64 * 10**6, codec="copy"), workers=1).frames
            else:
                index_lerobot(src, out)
            if r >= 0:
                (copy if kind == "copy" else ref).append(time.perf_counter() - t0)
    return copy, ref, frames


def _train_fps(index: EpisodeIndex) -> float:
    pipe = train_pipe(index, batch_size=BATCH, seed=0, rank=0, world_size=1, num_workers=2, epochs=1)
    t0, n = time.perf_counter(), 0
    for b in pipe:
        n += len(b["frame"])
    return n / (time.perf_counter() - t0)


def _written(out: Path) -> int:
    return sum(p.stat().st_size for p in out.iterdir() if p.is_file())


def _shares(out: Path, frames: int) -> str:
    """Bytes a frame, by what holds them: the index's own columns and JSON, its statistics, the piece table, the
    literal file (the tar and pack framing around the packets) and the rows file (the arrays' rows)."""
    parts = {"index": 0, "stats": 0, "pieces": 0, "literal": 0, "rows": 0}
    for p in out.iterdir():
        kind = "stats" if p.name == "index.stats.bin" else "literal" if p.name.startswith("reference.literal.") else \
            "rows" if p.name == "reference.rows.bin" else "pieces" if p.name.startswith("reference.") else "index"
        parts[kind] += p.stat().st_size
    return ", ".join(f"{k} {v / max(frames, 1):.0f}" for k, v in parts.items()) + " bytes/frame"


def run(workdir: Path, quick: bool) -> dict:
    encoder = available_encoders()[0]
    eps, length, (h, w), rounds = (4, 40, (96, 128), 2) if quick else (12, 150, (240, 320), 5)
    src = workdir / "lerobot"
    shutil.rmtree(src, ignore_errors=True)
    make_lerobot(src, num_episodes=eps, length=length, height=h, width=w, fps=30, encoder=encoder,
                 episodes_per_file=4, image_feature=False)
    copy_s, ref_s, frames = _index_times(src, workdir, 3 if quick else 11)
    ratio = [c / r for c, r in zip(copy_s, ref_s)]
    rows = [{"metric": f"index in place (--codec reference) vs --codec copy import, {frames:,} frames",
             "ours": frames / statistics.median(ref_s), "baseline": frames / statistics.median(copy_s),
             "ceiling": None, "unit": "frames/s",
             "note": f"whole call, index written; copy with 1 worker; {len(ratio)} alternated pairs after a warm one, "
                     f"each pair's ratio: median {statistics.median(ratio):.2f}x "
                     f"({min(ratio):.2f}-{max(ratio):.2f}); goal >= 3x"}]
    ref_ix = EpisodeIndex.open(workdir / "idx-ref", source_root=src)
    copy_ix = EpisodeIndex.open(workdir / "idx-copy")
    _train_fps(ref_ix)  # warm the page cache and the decoders
    got: dict[str, list[float]] = {"ref": [], "copy": []}
    for r in range(rounds):
        for kind in (("ref", "copy") if r % 2 else ("copy", "ref")):
            got[kind].append(_train_fps(ref_ix if kind == "ref" else copy_ix))
    tr = [a / b for a, b in zip(got["ref"], got["copy"])]
    rows.append({"metric": "train_pipe frames/s, in-place index vs copy-imported shards",
                 "ours": statistics.median(got["ref"]), "baseline": statistics.median(got["copy"]),
                 "ceiling": None, "unit": "frames/s",
                 "note": f"batch {BATCH}, 2 decode threads, one shuffled epoch; ratio {statistics.median(tr):.2f}x "
                         f"({min(tr):.2f}-{max(tr):.2f}); goal >= 0.9x"})
    rows += lerobot_windows.rows(workdir, src, workdir / "idx-ref", quick)
    rows += lerobot_s3.rows(workdir, quick)
    sizes = [(f"{h}x{w}", src, workdir / "idx-ref")]
    if not quick:
        big = workdir / "lerobot-480"
        shutil.rmtree(big, ignore_errors=True)
        make_lerobot(big, num_episodes=4, length=150, height=480, width=640, fps=30, encoder=encoder,
                     episodes_per_file=4, image_feature=False)
        index_lerobot(big, workdir / "idx-480")
        sizes.append(("480x640", big, workdir / "idx-480"))
    for label, root, out in sizes:
        data, written = _dataset_bytes(root), _written(out)
        frames_in = EpisodeIndex.open(out, source_root=root).frames
        rows.append({"metric": f"bytes written by the in-place index vs the dataset's, {label}", "ours": written,
                     "baseline": data, "ceiling": None, "unit": "bytes",
                     "note": f"{100 * written / data:.2f}% of the dataset ({_shares(out, frames_in)}); goal <= 2%"})
    return {"section": "reference", "intro": __doc__.split("\n\n", 1)[1].strip(), "rows": rows}


if __name__ == "__main__":
    import json
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        print(json.dumps(run(Path(tmp), "--quick" in sys.argv), indent=1))
