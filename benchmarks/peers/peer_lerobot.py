"""LeRobotDataset v3: its own writer (``create`` + ``add_frame`` + ``save_episode`` + ``finalize``, AV1 video
by PyAV) and its reader with the PyAV video backend, in a torch ``DataLoader``. No hub: a local root only.

``frames`` is no benchmark: it writes what ``LeRobotDataset(video_backend="pyav")[i]`` returns for every sample
to DATA/lerobot_frames.npz (episode_index, frame_index, and each camera's frames back in uint8 HxWx3), for the
lerobot section to compare with the frames of the copy import."""

from __future__ import annotations

import argparse
import os
import time

import common
import numpy as np
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = "epbench/peers"
CAMS = {c: f"observation.images.{c}" for c in common.CAMERAS}


def convert(a: argparse.Namespace) -> dict:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    frames, state, meta = common.load(a.data)
    size = meta["size"]
    features = {**{k: {"dtype": "video", "shape": (size, size, 3), "names": ["height", "width", "channels"]}
                   for k in CAMS.values()},
                "observation.state": {"dtype": "float32", "shape": (7,), "names": None}}
    t0 = time.perf_counter()
    ds = LeRobotDataset.create(REPO, fps=int(meta["fps"]), root=a.out, features=features, use_videos=True)
    for e in meta["episodes"]:
        for i in range(e["first"], e["first"] + e["length"]):
            ds.add_frame({CAMS["front"]: frames[i, 0], CAMS["wrist"]: frames[i, 1], "observation.state": state[i],
                          "task": "task"})
        ds.save_episode()
    ds.finalize()
    t = time.perf_counter() - t0
    import av

    return {"convert_s": t, "bytes": common.du(a.out), "jpeg_digest": None,
            "how": "LeRobotDataset.create + add_frame + save_episode (libsvtav1 video, its default)",
            "versions": {**common.versions("lerobot", "torchvision"), "av": av.__version__,
                         "lerobot": _version()}}


def _version() -> str:
    import importlib.metadata

    return importlib.metadata.version("lerobot")


def _dataset(a: argparse.Namespace, **kw):  # noqa: ANN202
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    return LeRobotDataset(REPO, root=a.out, video_backend="pyav", **kw)


def _ids(b: dict) -> list[int]:
    return b["index"].tolist()


def train(a: argparse.Namespace) -> dict:
    import lerobot  # noqa: F401  (imports before the timer, as for every peer)

    meta = common.load_meta(a.data)
    t0 = common.clock()
    ds = _dataset(a)
    loader = torch.utils.data.DataLoader(ds, batch_size=common.BATCH, shuffle=True, num_workers=common.WORKERS,
                                         generator=torch.Generator().manual_seed(a.seed))
    return common.train_epoch(loader, _ids, common.sample_episode(meta), t0)


def pinned(a: argparse.Namespace) -> dict:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset  # noqa: F401  (imports are not the read's cost)

    r0, t0 = common.rchar(), time.perf_counter()
    ds = _dataset(a, episodes=[a.episode])
    n = sum(1 for k in range(len(ds)) if ds[k] is not None)
    return {"seconds": time.perf_counter() - t0, "rchar": common.rchar() - r0, "frames": n,
            "how": "LeRobotDataset(episodes=[e]), every frame decoded from the shared mp4 by PyAV"}


def frames(a: argparse.Namespace) -> dict:
    """Every sample's camera frames as LeRobot returns them (float32 in [0, 1], CHW), back in uint8 HWC.

    LeRobot divides the decoded uint8 by 255 in float32, so ``round(x * 255)`` is the decoded byte again; a
    value further than 1e-3 from a whole byte would mean it is not, and is refused rather than rounded."""
    ds = _dataset(a)
    n, keys = len(ds), list(CAMS.values())
    out: dict[str, list] = {"episode_index": [], "frame_index": [], **{k: [] for k in keys}}
    t0 = time.perf_counter()
    for i in range(n):
        item = ds[i]
        out["episode_index"].append(int(item["episode_index"]))
        out["frame_index"].append(int(item["frame_index"]))
        for k in keys:
            x = item[k].numpy().transpose(1, 2, 0) * 255
            b = np.rint(x)
            if np.abs(x - b).max() > 1e-3:
                raise ValueError(f"sample {i} {k}: LeRobot returned a value that is not a byte / 255")
            out[k].append(b.astype(np.uint8))
    t = time.perf_counter() - t0
    np.savez(a.data / "lerobot_frames.npz", **{k.replace(".", "_"): np.asarray(v) for k, v in out.items()})
    return {"samples": n, "seconds": t, "lerobot": _version(), "video_backend": "pyav"}


if __name__ == "__main__":
    np.seterr(all="ignore")
    common.main({"convert": convert, "train": train, "pinned": pinned, "frames": frames})
