"""The decode ceiling: the same JPEG bytes, already in memory, decoded bare on 2 threads and nothing else.

``--method simplejpeg``: ``simplejpeg.decode_jpeg`` (libjpeg-turbo called directly, RGB HxWx3); ``--method cv2``:
``cv2.imdecode`` (BGR HxWx3). Each task decodes both cameras of a batch of 32 samples, in a seeded permutation of the
samples, on a ``ThreadPoolExecutor(2)``. No reading from disk (the file is read whole before the clock), no CHW
layout, no batch: what any loader of these bytes must spend at least, measured in the same run as the loaders.
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor

import common
import cv2
import numpy as np


def convert(a: argparse.Namespace) -> dict:
    frames, _, _ = common.load(a.data)
    a.out.mkdir(parents=True)
    t0 = time.perf_counter()
    d = common.JpegDigest()
    spans = common.write_jpegs(frames, a.out / "jpegs.bin", d)  # (offset, length) of every JPEG
    np.save(a.out / "spans.npy", spans)
    import simplejpeg

    return {"convert_s": time.perf_counter() - t0, "bytes": common.du(a.out), "jpeg_digest": d.hexdigest(),
            "how": "JPEGs concatenated in one file + an offsets array, 1 process",
            "versions": {**common.versions(), "simplejpeg": simplejpeg.__version__}}


def _decoder(method: str):  # noqa: ANN202
    if method == "simplejpeg":
        import simplejpeg

        return simplejpeg.decode_jpeg
    if method == "cv2":
        return lambda b: cv2.imdecode(np.frombuffer(b, np.uint8), cv2.IMREAD_COLOR)
    raise SystemExit(f"--method {method!r}: the bare decode is 'simplejpeg' or 'cv2'")


def train(a: argparse.Namespace) -> dict:
    decode = _decoder(a.method)
    meta = common.load_meta(a.data)
    ep_of = common.sample_episode(meta)
    blob, spans = (a.out / "jpegs.bin").read_bytes(), np.load(a.out / "spans.npy")
    jpegs = [[blob[o:o + n] for o, n in spans[i]] for i in range(len(spans))]  # bytes in memory before the clock
    t0 = common.clock()
    order = np.random.default_rng(a.seed).permutation(len(ep_of)).tolist()

    def task(ids: list[int]) -> list[int]:
        for i in ids:
            for data in jpegs[i]:
                decode(data)
        return ids

    with ThreadPoolExecutor(common.WORKERS) as ex:
        batches = ex.map(task, [order[k:k + common.BATCH] for k in range(0, len(order), common.BATCH)])
        return common.train_epoch(batches, lambda ids: ids, ep_of, t0)


if __name__ == "__main__":
    common.main({"convert": convert, "train": train})
