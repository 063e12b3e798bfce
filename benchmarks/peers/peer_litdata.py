"""LitData: ``optimize`` (2 worker processes) and ``StreamingDataset`` + ``StreamingDataLoader``."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import common

CHUNK_BYTES = 8_000_000
_DATA: dict[str, tuple] = {}


def _sample(task: tuple[str, int]) -> dict:
    """One sample as LitData's optimize workers make it (module level: it is pickled to them)."""
    data, i = task
    if data not in _DATA:
        _DATA[data] = common.load(Path(data))
    frames, state, _ = _DATA[data]
    return {"idx": i, "front": common.jpeg(frames[i, 0]), "wrist": common.jpeg(frames[i, 1]), "state": state[i]}


def _dataset(out, **kw):  # noqa: ANN001, ANN202
    from litdata import StreamingDataset

    class Decoded(StreamingDataset):
        def __getitem__(self, i: object) -> dict:
            return common.tensors(super().__getitem__(i))

    return Decoded(str(out), **kw)


def convert(a: argparse.Namespace) -> dict:
    from litdata import StreamingDataset, optimize

    _DATA[str(a.data)] = common.load(a.data)  # in memory before the timer (and before the fork)
    n = len(_DATA[str(a.data)][0])
    t0 = time.perf_counter()
    optimize(fn=_sample, inputs=[(str(a.data), i) for i in range(n)], output_dir=str(a.out),
             chunk_bytes=CHUNK_BYTES, num_workers=2, verbose=False)
    t = time.perf_counter() - t0
    size = common.du(a.out)
    ds = StreamingDataset(str(a.out))
    pos = {int(ds[k]["idx"]): k for k in range(len(ds))}
    d = common.JpegDigest()
    for i in range(n):
        s = ds[pos[i]]
        for c in common.CAMERAS:
            d.add(s[c])
    (a.out.parent / "litdata.positions.json").write_text(json.dumps([pos[i] for i in range(n)]))
    return {"convert_s": t, "bytes": size, "jpeg_digest": d.hexdigest(),
            "how": "optimize(num_workers=2), no compression", "versions": common.versions("litdata", "torchvision")}


def _loader(ds):  # noqa: ANN001, ANN202
    from litdata import StreamingDataLoader

    return StreamingDataLoader(ds, batch_size=common.BATCH, num_workers=common.WORKERS)


def train(a: argparse.Namespace) -> dict:
    import litdata  # noqa: F401  (imports before the timer, as for every peer)

    meta = common.load_meta(a.data)
    t0 = common.clock()
    loader = _loader(_dataset(a.out, shuffle=True, seed=a.seed))
    return common.train_epoch(loader, common.idx_of, common.sample_episode(meta), t0)


def pinned(a: argparse.Namespace) -> dict:
    import litdata  # noqa: F401  (imports read files too: not the dataset's cost)

    meta = common.load_meta(a.data)
    e = meta["episodes"][a.episode]
    pos = json.loads((a.out.parent / "litdata.positions.json").read_text())
    r0, t0 = common.rchar(), time.perf_counter()
    ds = _dataset(a.out)
    n = sum(1 for i in range(e["first"], e["first"] + e["length"]) if ds[pos[i]] is not None)
    return {"seconds": time.perf_counter() - t0, "rchar": common.rchar() - r0, "frames": n,
            "how": "ds[k] at the episode's positions, 1 thread (kept by the user: optimize's workers reorder samples)"}


def resume_save(a: argparse.Namespace) -> dict:
    return common.resume_save(_loader(_dataset(a.out, shuffle=True, seed=a.seed)), common.idx_of, a, "litdata")


def resume_load(a: argparse.Namespace) -> dict:
    return common.resume_load(_loader(_dataset(a.out, shuffle=True, seed=a.seed)), common.idx_of, a, "litdata")


if __name__ == "__main__":
    common.main({"convert": convert, "train": train, "pinned": pinned, "resume-save": resume_save,
                 "resume-load": resume_load})
