"""LeRobot's own loader on a LeRobot dataset, run in the lerobot virtualenv (`benchmarks.peers.venvs`) by
`benchmarks.bench_reference`: ``LeRobotDataset(root, video_backend="pyav", delta_timestamps=...)`` in a torch
``DataLoader`` (2 worker processes, batch 32, shuffled), with the reference section's windows: the front camera's
last 2 images, the wrist camera's current one, 16 steps of action.

Stages (one JSON line ``EPBENCH {...}`` on stdout):

- ``train ROOT BATCHES SEED``: seconds from the dataset's construction to the first batch, and frames/s after it,
  over ``BATCHES`` batches.
- ``windows ROOT INDICES``: for each sample index of the comma-separated ``INDICES``, the sha256 of every window
  image (uint8 HxWx3, LeRobot's float32 times 255, refused unless a whole byte) and of the actions' float32 bytes.

Needs only the lerobot venv (torch, lerobot, numpy): it imports nothing of episodepipes.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
FRONT, WRIST = "observation.images.front", "observation.images.wrist"
BATCH, WORKERS, HISTORY, HORIZON = 32, 2, 2, 16


def dataset(root: str):  # noqa: ANN201
    from lerobot.datasets.lerobot_dataset import LeRobotDataset, LeRobotDatasetMetadata

    fps = LeRobotDatasetMetadata("episodepipes/bench", root=root).fps
    deltas = {FRONT: [(k - HISTORY + 1) / fps for k in range(HISTORY)], "action": [k / fps for k in range(HORIZON)]}
    return LeRobotDataset("episodepipes/bench", root=root, video_backend="pyav", delta_timestamps=deltas)


def train(root: str, batches: int, seed: int) -> dict:
    import torch

    t0 = time.perf_counter()
    loader = torch.utils.data.DataLoader(dataset(root), batch_size=BATCH, shuffle=True, num_workers=WORKERS,
                                         generator=torch.Generator().manual_seed(seed))
    first = t_first = None
    n = 0
    for k, b in enumerate(loader):
        if first is None:
            first = time.perf_counter()
            t_first = first - t0
        else:
            n += len(b["index"])
        if k + 1 == batches:
            break
    return {"first_batch_s": t_first, "frames": n, "fps": n / (time.perf_counter() - first)}


def _byte_digest(x) -> str:  # noqa: ANN001
    import numpy as np

    v = x.numpy().transpose(1, 2, 0) * 255
    b = np.rint(v)
    if np.abs(v - b).max() > 1e-3:
        raise ValueError("LeRobot returned a value that is not a byte / 255")
    return hashlib.sha256(b.astype(np.uint8).tobytes()).hexdigest()


def windows(root: str, indices: list[int]) -> dict:
    ds = dataset(root)
    out = {}
    for i in indices:
        item = ds[i]
        out[str(i)] = {"episode_index": int(item["episode_index"]), "frame_index": int(item["frame_index"]),
                       FRONT: [_byte_digest(x) for x in item[FRONT]], WRIST: [_byte_digest(item[WRIST])],
                       "action": hashlib.sha256(item["action"].numpy().astype("<f4").tobytes()).hexdigest()}
    return {"samples": out}


if __name__ == "__main__":
    stage, root = sys.argv[1], sys.argv[2]
    res = train(root, int(sys.argv[3]), int(sys.argv[4])) if stage == "train" else \
        windows(root, [int(x) for x in sys.argv[3].split(",")])
    sys.stdout.write("EPBENCH " + json.dumps(res) + "\n")
