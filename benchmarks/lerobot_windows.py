"""The reference section's rows against LeRobot's own loader: `train_pipe` on the in-place index against
``LeRobotDataset(video_backend="pyav")`` in a torch ``DataLoader`` (2 worker processes), on the same mp4 files with
the same windows (the front camera's last 2 images, the wrist camera's current one, 16 steps of action through
``delta_timestamps``), batch 32, shuffled. LeRobot runs in its own virtualenv (`benchmarks.peers.venvs`) through
`benchmarks.lerobot_loader`; ours with 2 decode threads.

Speed: frames/s after the first batch over the same number of batches, each side once a round, alternating which goes
first; the ratio is the median of the rounds' ratios with their range; the first batch's time is each side's from
opening the dataset (LeRobot: constructing it and its DataLoader, its workers started; ours: `EpisodeIndex.open` and
`train_pipe`) to the first batch in hand, median over the rounds. Parity: 128 samples drawn (seeded) from one epoch of
ours, their window images compared by sha256 with LeRobot's for the same samples, and their actions.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import subprocess
import time
from pathlib import Path

import numpy as np

from benchmarks.peers import venvs
from episodepipes.index import EpisodeIndex
from episodepipes.pipes.train import train_pipe

HERE = Path(__file__).resolve().parent
FRONT, WRIST = "observation.images.front", "observation.images.wrist"
BATCH, HISTORY, HORIZON, PARITY = 32, 2, 16, 128


def _windows() -> dict:
    return {"history": {FRONT.replace(".", "_"): HISTORY}, "horizon": {"action": HORIZON}}


def _lerobot(py: Path, log: Path, *args: str) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
    r = subprocess.run([str(py), str(HERE / "lerobot_loader.py"), *args], capture_output=True, text=True,
                       timeout=900, env=env)
    with open(log, "a") as f:
        f.write(f"== lerobot_loader {args[0]} rc={r.returncode}\n{r.stderr[-4000:]}\n")
    for line in r.stdout.splitlines():
        if line.startswith("EPBENCH "):
            return json.loads(line[8:])
    raise RuntimeError(f"lerobot_loader {args[0]} exited {r.returncode} (see {log})")


def _ours(src: Path, ref: Path, batches: int, seed: int) -> dict:
    t0 = time.perf_counter()
    pipe = train_pipe(EpisodeIndex.open(ref, source_root=src), batch_size=BATCH, seed=seed, num_workers=2,
                      epochs=None, **_windows())
    first, n = None, 0
    for k, b in enumerate(pipe):
        if first is None:
            first = time.perf_counter()
            t_first = first - t0
        else:
            n += len(b["frame"])
        if k + 1 == batches:
            break
    return {"first_batch_s": t_first, "frames": n, "fps": n / (time.perf_counter() - first)}


def _digest(img: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(img.transpose(1, 2, 0)).tobytes()).hexdigest()


def _parity(py: Path, log: Path, src: Path, ref: Path) -> dict:
    """Frames (and action windows) of `PARITY` samples equal in ours and in LeRobot's."""
    index = EpisodeIndex.open(ref, source_root=src)
    starts = np.cumsum([0] + [e.length for e in index.episodes])
    number = {e.id: k for k, e in enumerate(index.episodes)}
    front, wrist = FRONT.replace(".", "_"), WRIST.replace(".", "_")
    ours = {}
    for b in train_pipe(index, batch_size=BATCH, seed=7, num_workers=2, epochs=1, **_windows()):
        for j, (e, f) in enumerate(zip(b["episode"], b["frame"])):
            ours[int(starts[number[e]] + int(f))] = {
                FRONT: [_digest(x) for x in b[front][j].numpy()], WRIST: [_digest(b[wrist][j].numpy())],
                "action": hashlib.sha256(b["action"][j].numpy().astype("<f4").tobytes()).hexdigest()}
    pick = sorted(np.random.default_rng(0).choice(sorted(ours), PARITY, replace=False).tolist())
    theirs = _lerobot(py, log, "windows", str(src), ",".join(map(str, pick)))["samples"]
    equal = total = actions = 0
    for i in pick:
        for key in (FRONT, WRIST):
            total += len(theirs[str(i)][key])
            equal += sum(a == b for a, b in zip(ours[i][key], theirs[str(i)][key]))
        actions += ours[i]["action"] == theirs[str(i)]["action"]
    return {"equal": equal, "of": total, "actions": actions}


def rows(workdir: Path, src: Path, ref: Path, quick: bool) -> list[dict]:
    """The speed, first-batch and parity rows; one "not run: <why>" row when the lerobot venv cannot be built."""
    metric = "train_pipe in place vs LeRobotDataset + DataLoader(2 workers), 2-image history + 16 actions"
    log = workdir / "lerobot-loader.log"
    try:
        py = venvs.ensure("lerobot", log=log)
    except (RuntimeError, OSError, subprocess.CalledProcessError) as e:
        return [{"metric": metric, "ours": None, "baseline": None, "ceiling": None, "unit": "frames/s",
                 "note": f"not run: the lerobot virtualenv could not be built ({e})"}]
    rounds, batches = (1, 4) if quick else (3, 20)
    got: dict[str, list[dict]] = {"ours": [], "lerobot": []}
    _ours(src, ref, 2, 99)  # warm the page cache and our decoders' first import
    for r in range(rounds):
        for side in (("ours", "lerobot") if r % 2 else ("lerobot", "ours")):
            got[side].append(_ours(src, ref, batches, r) if side == "ours" else
                             _lerobot(py, log, "train", str(src), str(batches), str(r)))
    ratio = [a["fps"] / b["fps"] for a, b in zip(got["ours"], got["lerobot"])]
    first = {k: statistics.median(x["first_batch_s"] for x in v) for k, v in got.items()}
    par = _parity(py, log, src, ref)
    return [{"metric": metric, "ours": statistics.median(x["fps"] for x in got["ours"]),
             "baseline": statistics.median(x["fps"] for x in got["lerobot"]), "ceiling": None, "unit": "frames/s",
             "note": f"same mp4s and windows, batch {BATCH}, {batches} batches a side a round, {rounds} round(s); "
                     f"{statistics.median(ratio):.2f}x ({min(ratio):.2f}-{max(ratio):.2f})"},
            {"metric": "first batch: train_pipe in place vs LeRobotDataset + DataLoader(2 workers)",
             "ours": first["ours"], "baseline": first["lerobot"], "ceiling": None, "unit": "s",
             "note": "from opening the dataset to the first batch in hand (LeRobot: its 2 workers started), median"},
            {"metric": 'window images equal to LeRobotDataset(video_backend="pyav")[i]', "ours": par["equal"],
             "baseline": par["of"], "ceiling": None, "unit": "frames",
             "note": f"{PARITY} samples of one epoch of ours (seeded draw), 2 front + 1 wrist image each, by sha256; "
                     f"their 16-step action windows equal in {par['actions']} of {PARITY}"}]
