"""WebDataset: ``ShardWriter``, then ``WebDataset(shardshuffle).shuffle(1000)`` + cv2 decode + ``DataLoader``."""

from __future__ import annotations

import argparse
import time

import common
import numpy as np
import torch

SHARD_BYTES = 8_000_000


def _urls(out) -> list[str]:  # noqa: ANN001
    return sorted(str(p) for p in out.glob("shard-*.tar"))


def _cv2(key: str, data: bytes) -> object:
    """The decode handler: cv2 for the JPEGs (module level: it is pickled to the workers)."""
    if key.endswith(".jpg"):
        return torch.from_numpy(common.decode_rgb(data)).permute(2, 0, 1)
    return None


def convert(a: argparse.Namespace) -> dict:
    import webdataset as wds

    frames, state, meta = common.load(a.data)
    a.out.mkdir(parents=True)
    t0 = time.perf_counter()
    with wds.ShardWriter(str(a.out / "shard-%06d.tar"), maxsize=SHARD_BYTES, maxcount=10**9, verbose=0) as w:
        for e in meta["episodes"]:
            for f in range(e["length"]):
                i = e["first"] + f
                w.write({"__key__": f"{e['id']}/{f:06d}", "idx.cls": i, "front.jpg": common.jpeg(frames[i, 0]),
                         "wrist.jpg": common.jpeg(frames[i, 1]), "state.npy": state[i]})
    t = time.perf_counter() - t0
    d = common.JpegDigest()
    for s in wds.WebDataset(_urls(a.out), shardshuffle=False, empty_check=False):
        for c in common.CAMERAS:
            d.add(s[f"{c}.jpg"])
    return {"convert_s": t, "bytes": common.du(a.out), "jpeg_digest": d.hexdigest(),
            "how": "wds.ShardWriter, 1 process", "versions": common.versions("webdataset")}


def _pipeline(urls: list[str], seed: int):  # noqa: ANN202
    import webdataset as wds

    return (wds.WebDataset(urls, shardshuffle=len(urls), seed=seed, empty_check=False).shuffle(1000)
            .decode(_cv2).to_tuple("idx.cls", "front.jpg", "wrist.jpg", "state.npy"))


def train(a: argparse.Namespace) -> dict:
    import webdataset  # noqa: F401  (imports before the timer, as for every peer)

    meta = common.load_meta(a.data)
    t0 = common.clock()
    loader = torch.utils.data.DataLoader(_pipeline(_urls(a.out), a.seed), batch_size=common.BATCH,
                                         num_workers=common.WORKERS)
    return common.train_epoch(loader, lambda b: [int(x) for x in b[0]], common.sample_episode(meta), t0)


def pinned(a: argparse.Namespace) -> dict:
    import webdataset as wds

    meta = common.load_meta(a.data)
    e = meta["episodes"][a.episode]
    prefix = e["id"] + "/"
    r0, t0 = common.rchar(), time.perf_counter()
    ds = (wds.WebDataset(_urls(a.out), shardshuffle=False, empty_check=False)
          .select(lambda s: s["__key__"].startswith(prefix)).decode(_cv2))
    n = sum(1 for _ in ds)
    return {"seconds": time.perf_counter() - t0, "rchar": common.rchar() - r0, "frames": n,
            "how": "stream every shard, select by key: a tar stream has no index to seek with"}


if __name__ == "__main__":
    np.seterr(all="ignore")
    common.main({"convert": convert, "train": train, "pinned": pinned})
