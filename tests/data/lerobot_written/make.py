"""Regenerate the LeRobot datasets beside this file with LeRobot's own writer, and what LeRobot's loader reads back.

Run from the repository root with the project's interpreter: ``python tests/data/lerobot_written/make.py``. It cuts
real footage (Debian's clips, `benchmarks.footage`) into episodes, then runs itself in the lerobot virtualenv
(`benchmarks.peers.venvs`, lerobot 0.4.4) to write two datasets with ``LeRobotDataset.create`` + ``add_frame`` +
``save_episode`` + ``finalize``:

- ``av1/``: LeRobot's defaults (libsvtav1, GOP 2, crf 30, each episode encoded from its PNGs), one mp4 a camera.
- ``h264/``: ``vcodec="h264"`` with ``streaming_encoding=True`` (frames encoded as they are added) and a small
  ``video_files_size_in_mb``, so the episodes are split over several mp4 files a camera, several in each.

(HEVC is left out: LeRobot's HEVC has B-frames, which its own PyAV loader and our index both refuse.)

For every sample ``i``, ``LeRobotDataset(root, video_backend="pyav")[i]`` is recorded in ``<name>/lerobot.json``:
its index, episode, frame, timestamp and task, each camera's frame as the sha256 of its uint8 HxWx3 bytes (LeRobot's
float32 in [0, 1] times 255, refused unless each value is a whole byte), and the state and action arrays. The tests
compare with these, so they need no lerobot.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
CAMERAS = ("observation.images.front", "observation.images.wrist")
SIZE = (96, 128)  # H, W
FPS = 10
DATASETS = {"av1": {"lengths": (12, 9, 14, 11), "create": {}},
            "h264": {"lengths": (10, 13, 8, 12, 9, 11), "create": {"vcodec": "h264", "streaming_encoding": True},
                     "video_files_size_in_mb": 0.025}}


def footage(lengths: tuple[int, ...], seed: int) -> dict:
    """Episodes of real footage: camera k of episode e is clip (e + k + seed) % 3 from an offset moving with e."""
    import cv2

    from benchmarks.footage import clip_frames, clip_paths

    clips = clip_paths()
    out: dict = {"lengths": list(lengths)}
    for e, n in enumerate(lengths):
        rng = np.random.default_rng([seed, e])
        state = (rng.normal(size=(n, 7)).cumsum(0) * 0.05).astype(np.float32)
        out[f"state{e}"] = state
        out[f"action{e}"] = np.diff(state, axis=0, append=state[-1:]).astype(np.float32)
        for k in range(len(CAMERAS)):
            bgr = clip_frames(clips[(e + k + seed) % len(clips)], (e * 29 + k * 53 + seed * 7) % 100, n, SIZE)
            out[f"cam{k}_{e}"] = np.stack([cv2.cvtColor(f, cv2.COLOR_BGR2RGB) for f in bgr])
    return out


def write(name: str, frames: Path, root: Path) -> None:
    """In the lerobot venv: the dataset ``name`` from the episodes in ``frames`` (npz), then LeRobot's reads."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    spec, z = DATASETS[name], np.load(frames)
    features = {**{c: {"dtype": "video", "shape": (*SIZE, 3), "names": ["height", "width", "channels"]}
                   for c in CAMERAS},
                "observation.state": {"dtype": "float32", "shape": (7,), "names": None},
                "action": {"dtype": "float32", "shape": (7,), "names": None}}
    shutil.rmtree(root, ignore_errors=True)
    ds = LeRobotDataset.create(f"episodepipes/{name}", fps=FPS, root=root, features=features, use_videos=True,
                               **spec["create"])
    if "video_files_size_in_mb" in spec:
        ds.meta.update_chunk_settings(video_files_size_in_mb=spec["video_files_size_in_mb"])
    for e, n in enumerate(z["lengths"].tolist()):
        for t in range(n):
            ds.add_frame({CAMERAS[0]: z[f"cam0_{e}"][t], CAMERAS[1]: z[f"cam1_{e}"][t],
                          "observation.state": z[f"state{e}"][t], "action": z[f"action{e}"][t],
                          "task": f"move the block {'left' if e % 2 else 'right'}"})
        ds.save_episode()
    ds.finalize()
    read = LeRobotDataset(f"episodepipes/{name}", root=root, video_backend="pyav")
    samples = []
    for i in range(len(read)):
        item = read[i]
        s = {k: int(item[k]) for k in ("index", "episode_index", "frame_index")}
        s |= {"timestamp": float(item["timestamp"]), "task": item["task"],
              "observation.state": item["observation.state"].tolist(), "action": item["action"].tolist()}
        for c in CAMERAS:
            x = item[c].numpy().transpose(1, 2, 0) * 255
            b = np.rint(x)
            if np.abs(x - b).max() > 1e-3:
                raise ValueError(f"{name} sample {i} {c}: LeRobot returned a value that is not a byte / 255")
            s[c] = hashlib.sha256(b.astype(np.uint8).tobytes()).hexdigest()
        samples.append(s)
    import importlib.metadata

    import av

    versions = {m: importlib.metadata.version(m) for m in ("lerobot", "torch", "av")}
    (root / "lerobot.json").write_text(json.dumps({"versions": versions, "video_backend": "pyav", "ffmpeg": {
        k: ".".join(map(str, v)) for k, v in av.library_versions.items() if k in ("libavcodec", "libavformat")},
        "samples": samples}, indent=0) + "\n")


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] in DATASETS:  # the lerobot venv's half
        write(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]))
        return
    sys.path.insert(0, str(HERE.parents[2]))
    from benchmarks.peers import venvs

    py = venvs.ensure("lerobot")
    for seed, name in enumerate(DATASETS):
        npz = HERE / f".{name}-frames.npz"
        np.savez(npz, **footage(DATASETS[name]["lengths"], seed))
        try:
            env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
            subprocess.run([str(py), __file__, name, str(npz), str(HERE / name)], check=True, env=env)
        finally:
            npz.unlink()
        for junk in (HERE / name).rglob("*"):  # LeRobot's scratch folders, if any were left
            if junk.is_dir() and not any(junk.iterdir()):
                junk.rmdir()
    total = sum(p.stat().st_size for p in HERE.rglob("*") if p.is_file())
    print(f"{total:,} bytes under {HERE}")


if __name__ == "__main__":
    main()
