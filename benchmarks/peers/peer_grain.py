"""Grain: the same JPEG bytes in ArrayRecord files, read by ``MapDataset.source(...).shuffle().map(decode)``.

``--method thread``: ``to_iter_dataset(ReadOptions(num_threads=2))`` (Grain's thread pool runs the reads and the
decode map); ``--method process``: the same, then ``mp_prefetch(MultiprocessingOptions(num_workers=2))``. Decode is
cv2 (`common.decode_rgb`), as every JPEG peer here; batches are stacked numpy arrays (Grain yields no tensors).
"""

from __future__ import annotations

import argparse
import pickle
import time

import common
import numpy as np

RECORDS_PER_FILE = 600


def _paths(out) -> list[str]:  # noqa: ANN001
    return sorted(str(p) for p in out.glob("part-*.array_record"))


def convert(a: argparse.Namespace) -> dict:
    from array_record.python.array_record_module import ArrayRecordWriter

    frames, state, meta = common.load(a.data)
    a.out.mkdir(parents=True)
    t0 = time.perf_counter()
    d = common.JpegDigest()
    for first in range(0, len(frames), RECORDS_PER_FILE):
        w = ArrayRecordWriter(str(a.out / f"part-{first // RECORDS_PER_FILE:05d}.array_record"), "group_size:1")
        for i in range(first, min(len(frames), first + RECORDS_PER_FILE)):
            rec = {"idx": i, "front": d.add(common.jpeg(frames[i, 0])), "wrist": d.add(common.jpeg(frames[i, 1])),
                   "state": state[i]}
            w.write(pickle.dumps(rec))
        w.close()
    t = time.perf_counter() - t0
    return {"convert_s": t, "bytes": common.du(a.out), "jpeg_digest": d.hexdigest(),
            "how": "ArrayRecordWriter (group_size:1), pickled records, 1 process", "versions": common.versions("grain")}


def decode(raw: bytes) -> dict:
    """One record to RGB ``[3, H, W]`` frames (module level: it is pickled to Grain's worker processes)."""
    s = pickle.loads(raw)
    return {"idx": s["idx"], "state": s["state"],
            **{c: np.ascontiguousarray(common.decode_rgb(s[c]).transpose(2, 0, 1)) for c in common.CAMERAS}}


def stack(samples: list) -> dict:
    return {k: np.stack([s[k] for s in samples]) for k in samples[0]}


def _dataset(out, seed: int, method: str):  # noqa: ANN001, ANN202
    import grain

    ds = (grain.MapDataset.source(grain.sources.ArrayRecordDataSource(_paths(out))).shuffle(seed=seed).map(decode)
          .to_iter_dataset(grain.ReadOptions(num_threads=common.WORKERS, prefetch_buffer_size=2 * common.BATCH))
          .batch(common.BATCH, batch_fn=stack))
    if method == "process":
        ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=common.WORKERS))
    return ds


def train(a: argparse.Namespace) -> dict:
    import grain  # noqa: F401  (imports before the timer, as for every peer)

    meta = common.load_meta(a.data)
    t0 = common.clock()
    return common.train_epoch(_dataset(a.out, a.seed, a.method), lambda b: b["idx"].tolist(),
                              common.sample_episode(meta), t0)


def pinned(a: argparse.Namespace) -> dict:
    import grain

    meta = common.load_meta(a.data)
    e = meta["episodes"][a.episode]
    r0, t0 = common.rchar(), time.perf_counter()
    src = grain.sources.ArrayRecordDataSource(_paths(a.out))
    n = 0
    for i in range(e["first"], e["first"] + e["length"]):  # records are in sample order: index straight in
        decode(src[i])
        n += 1
    return {"seconds": time.perf_counter() - t0, "rchar": common.rchar() - r0, "frames": n,
            "how": "random access by record number (ArrayRecord's index), 1 thread"}


if __name__ == "__main__":
    common.main({"convert": convert, "train": train, "pinned": pinned})
