"""The copy import's frames against LeRobot's own decode of the same dataset, written by LeRobot's own writer.

A dataset made by ``LeRobotDataset.create`` + ``save_episode`` (several episodes per mp4, LeRobot's layout and
encoder settings) is imported with ``--codec copy``; `video_pipe` reads every frame back, and the lerobot
virtualenv (`benchmarks.peers.venvs`) writes what ``LeRobotDataset(video_backend="pyav")[i]`` returns for every
sample. Equal means byte-equal RGB, frame by frame; the row says how many and the largest difference.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np

from benchmarks.bench_peers import PEERS_DIR, make_frames
from benchmarks.lerobot_data import make_lerobot
from benchmarks.peers import venvs
from episodepipes.index import EpisodeIndex
from episodepipes.pipes import video_pipe
from episodepipes.sharding.formats.lerobot import LeRobotReader
from episodepipes.sharding.write import WriteOptions, write_shards

EPISODES, LENGTH, SIZE = 8, 45, 128
FIXTURE_LENGTHS = (9, 7, 11, 10, 13, 6, 8, 12)  # 4 per mp4 at GOP 4: 5 of 8 start mid-GOP


def _stage(py: Path, stage: str, data: Path, root: Path, log: Path) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
    r = subprocess.run([str(py), str(PEERS_DIR / "peer_lerobot.py"), stage, str(data), str(root)],
                       capture_output=True, text=True, timeout=900, env=env)
    with open(log, "a") as f:
        f.write(f"== lerobot {stage} rc={r.returncode}\n{r.stderr[-4000:]}\n")
    for line in r.stdout.splitlines():
        if line.startswith("EPBENCH "):
            return json.loads(line[8:])
    tail = (r.stderr.strip().splitlines() or ["no output"])[-1]
    raise RuntimeError(f"lerobot {stage} exited {r.returncode}: {tail[:300]} (see {log})")


def ours(out: Path) -> dict[tuple[int, int, str], np.ndarray]:
    """(episode_index, frame_index, camera) -> the RGB frame `video_pipe` returns from the shards in ``out``."""
    index = EpisodeIndex.open(out, verify=True)
    got: dict[tuple[int, int, str], np.ndarray] = {}
    cams = sorted({c for e in index.episodes for c in e.cameras})
    for b in video_pipe(out, episodes=[e.id for e in index.episodes], batch_size=16, max_batches=10**6):
        for c in cams:
            for e, f, img, v in zip(b["episode"], b["frame"], b[c], b["valid"], strict=True):
                if not v:
                    raise RuntimeError(f"episode {e} frame {int(f)} camera {c}: not valid")
                got[int(e.rsplit("_", 1)[1]), int(f), c] = img.numpy().transpose(1, 2, 0).copy()
    return got


def compare(want: dict[tuple[int, int, str], np.ndarray], got: dict[tuple[int, int, str], np.ndarray]) -> dict:
    """Frames of ``want`` that ``got`` holds byte-equal; a frame missing from ``got``, or one only it has, counts
    as unequal; ``max_diff`` is over the frames both hold (None if they share none)."""
    both = want.keys() & got.keys()
    diffs = [int(np.abs(want[k].astype(np.int16) - got[k].astype(np.int16)).max()) for k in sorted(both)]
    return {"equal": sum(d == 0 for d in diffs), "of": len(want.keys() | got.keys()),
            "missing": len(want.keys() - got.keys()), "extra": len(got.keys() - want.keys()),
            "max_diff": max(diffs) if diffs else None}


def _lerobot_frames(npz: Path) -> dict[tuple[int, int, str], np.ndarray]:
    z = np.load(npz)
    cams = [k for k in z.files if k not in ("episode_index", "frame_index")]
    return {(int(e), int(f), c): z[c][i] for c in cams
            for i, (e, f) in enumerate(zip(z["episode_index"], z["frame_index"], strict=True))}


def _parity(py: Path, data: Path, root: Path, out: Path, log: Path) -> dict:
    """LeRobot's frames of the dataset in ``root`` (into ``data``) against the copy import's, into ``out``."""
    data.mkdir(parents=True, exist_ok=True)
    ref = _stage(py, "frames", data, root, log)
    write_shards(LeRobotReader(root, copy=True), out, WriteOptions(format="lerobot", codec="copy"), workers=2)
    return {**compare(_lerobot_frames(data / "lerobot_frames.npz"), ours(out)), "lerobot": ref["lerobot"],
            "mp4s": len(list((root / "videos").rglob("*.mp4")))}


def _note(c: dict, what: str) -> str:
    return (f"frames equal: {c['equal']} of {c['of']}, max abs diff {c['max_diff']} ({c['missing']} missing, "
            f"{c['extra']} extra); {what}")


def rows(workdir: Path) -> list[dict]:
    """The parity rows; one "not run: <why>" row only when the lerobot virtualenv cannot be built."""
    metric = 'copy import frames vs LeRobotDataset(video_backend="pyav")[i], {}'
    log = workdir / "lerobot-parity.log"
    try:
        py = venvs.ensure("lerobot", log=log)
    except (RuntimeError, OSError, subprocess.CalledProcessError) as e:
        return [{"metric": metric.format("not run"), "ours": None, "baseline": None, "ceiling": None,
                 "unit": "frames", "note": f"not run: the lerobot virtualenv could not be built ({e})"}]
    import av

    data, root = workdir / "parity-data", workdir / "parity-lerobot"
    make_frames(data, episodes=EPISODES, length=LENGTH, size=SIZE)
    conv = _stage(py, "convert", data, root, log)
    own = _parity(py, data, root, workdir / "parity-copy", log)
    built = venvs.build_seconds("lerobot")
    fixture = workdir / "parity-fixture"
    make_lerobot(fixture, lengths=FIXTURE_LENGTHS, num_episodes=len(FIXTURE_LENGTHS), height=96, width=128,
                 fps=30, encoder="libsvtav1", episodes_per_file=4, image_feature=False, gop=4)
    fix = _parity(py, workdir / "parity-fixture-data", fixture, workdir / "parity-fixture-copy", log)
    versions = (f"LeRobot {own['lerobot']} decodes with PyAV {conv['versions']['av']}, video_pipe with PyAV "
                f"{av.__version__}")
    return [{"metric": metric.format("a dataset LeRobot's own writer made"), "ours": own["equal"],
             "baseline": own["of"], "ceiling": None, "unit": "frames",
             "note": _note(own, f"{EPISODES} episodes x {LENGTH} frames x 2 cameras, {SIZE}x{SIZE}, by "
                                f"LeRobotDataset.create + save_episode ({own['mp4s']} mp4s, one per camera; every "
                                f"episode starts on a keyframe); {versions}; the lerobot venv "
                                + (f"took {built:.0f} s to build (once, cached)" if built else "was built earlier"))},
            {"metric": metric.format("episodes starting mid-GOP"), "ours": fix["equal"], "baseline": fix["of"],
             "ceiling": None, "unit": "frames",
             "note": _note(fix, f"the project's fixture (benchmarks/lerobot_data.py): episodes of "
                                f"{'/'.join(map(str, FIXTURE_LENGTHS))} frames, 4 per mp4, AV1 at GOP 4, so 5 of 8 "
                                "start mid-GOP (the copy keeps the leading packets and skips them at decode)")}]
