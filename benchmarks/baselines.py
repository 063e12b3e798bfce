"""The loaders a user would write without episodepipes, measured by the benchmarks and the demo."""

from __future__ import annotations

import time

import cv2
import numpy as np
import torch
import webdataset as wds

from episodepipes.pipes import EpisodeIndex


def _decode_sample(sample: dict) -> dict:
    """Decode every camera of one webdataset sample with cv2, as a typical val loader does."""
    out = {"__key__": sample["__key__"], "frames": 0}
    for k, v in sample.items():
        if k.endswith(".jpg"):
            img = cv2.imdecode(np.frombuffer(v, np.uint8), cv2.IMREAD_COLOR)
            out[k] = torch.from_numpy(cv2.cvtColor(img, cv2.COLOR_BGR2RGB)).permute(2, 0, 1)
            out["frames"] += 1
    return out


class _Pinned:
    """Select the pinned episodes' samples by key (picklable, for DataLoader workers)."""

    def __init__(self, episodes: list[str]) -> None:
        self.episodes = set(episodes)

    def __call__(self, sample: dict) -> bool:
        return sample["__key__"].rsplit("/", 1)[0] in self.episodes


def naive_pinned_pass(index: EpisodeIndex, episodes: list[str], *, num_workers: int = 2,
                      batch_size: int = 16) -> dict:
    """One pass of a ``webdataset.WebDataset`` + ``DataLoader`` over the shards holding ``episodes``.

    The consumer skips every batch, as an early-returning ``validation_step`` does, but the workers
    have already read and decoded them. Bytes read are the whole shards, which is what a tar stream
    reads.
    """
    shard_ids = sorted({s.shard for e in episodes for s in index.episode(e).segments})
    urls = [str(index.shard_path(i)) for i in shard_ids]
    ds = (wds.WebDataset(urls, shardshuffle=False, empty_check=False).select(_Pinned(episodes))
          .map(_decode_sample).to_tuple("frames"))
    loader = torch.utils.data.DataLoader(ds, batch_size=batch_size, num_workers=num_workers)
    t0 = time.perf_counter()
    frames = 0
    for (n,) in loader:
        frames += int(n.sum())  # the validation_step would `return` here: the work is already done
    seconds = time.perf_counter() - t0
    return {"frames_decoded": frames, "bytes_read": sum(index.shards[i].bytes for i in shard_ids),
            "seconds": seconds}
