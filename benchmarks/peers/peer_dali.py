"""DALI: the same JPEG bytes in one flat file, fed by ``fn.external_source`` to a CPU pipeline that decodes them.

The pipeline is ``pipeline_def(batch_size=32, num_threads=2, device_id=None)`` (no GPU): ``fn.external_source``
yields whole batches of JPEG byte arrays (views of one memory-mapped file, in a seeded permutation of the
samples), ``fn.decoders.image(device="cpu", output_type=RGB)`` decodes them on DALI's own thread pool (its
libjpeg-turbo path, not cv2: DALI's decoder is the point of the peer) and ``fn.transpose`` makes them ``[3, H, W]``
as every other peer yields them. No resize: the stored frames are already 224x224, as for every peer.
DALI has no shuffling reader for paired records of two cameras, so the sample order is drawn in Python, once per
batch: a few microseconds per sample beside the decode.
"""

from __future__ import annotations

import argparse
import time

import common
import numpy as np


def convert(a: argparse.Namespace) -> dict:
    frames, state, meta = common.load(a.data)
    a.out.mkdir(parents=True)
    t0 = time.perf_counter()
    d = common.JpegDigest()
    spans = common.write_jpegs(frames, a.out / "jpegs.bin", d)  # (offset, length) of every JPEG
    np.save(a.out / "spans.npy", spans)
    np.save(a.out / "state.npy", state)
    t = time.perf_counter() - t0
    from nvidia.dali import __version__ as dali_version

    return {"convert_s": t, "bytes": common.du(a.out), "jpeg_digest": d.hexdigest(),
            "how": "JPEGs concatenated in one file + an offsets array, 1 process",
            "versions": {**common.versions(), "dali": dali_version}}


class _Batches:
    """External source: the JPEG bytes (both cameras) and sample numbers of each batch, in the given order."""

    def __init__(self, out, order: np.ndarray) -> None:  # noqa: ANN001
        self.spans, self.blob = np.load(out / "spans.npy"), np.memmap(out / "jpegs.bin", np.uint8, mode="r")
        self.order = order

    def __call__(self, info) -> tuple:  # noqa: ANN001
        first = info.iteration * common.BATCH
        if first >= len(self.order):
            raise StopIteration
        ids = self.order[first:first + common.BATCH]
        cams = [[self.blob[o:o + n] for o, n in self.spans[ids, k]] for k in range(len(common.CAMERAS))]
        return (*cams, [np.array([i], np.int64) for i in ids])


def _pipe(out, order: np.ndarray, threads: int = common.WORKERS):  # noqa: ANN001, ANN202
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def(batch_size=common.BATCH, num_threads=threads, device_id=None, prefetch_queue_depth=2)
    def pipe():  # noqa: ANN202
        *cams, idx = fn.external_source(source=_Batches(out, order), num_outputs=len(common.CAMERAS) + 1,
                                        batch=True, batch_info=True)
        imgs = [fn.transpose(fn.decoders.image(c, device="cpu", output_type=types.RGB), perm=[2, 0, 1])
                for c in cams]
        return (*imgs, idx)

    p = pipe()
    p.build()
    return p


def _run(p) -> object:  # noqa: ANN001
    """Batches of the pipeline until its source ends, as {camera: [B, 3, H, W], idx: [B]} numpy arrays."""
    while True:
        try:
            outs = p.run()
        except StopIteration:
            return
        yield {"idx": outs[-1].as_array()[:, 0], **{c: outs[k].as_array() for k, c in enumerate(common.CAMERAS)}}


def train(a: argparse.Namespace) -> dict:
    import nvidia.dali  # noqa: F401  (imports before the timer, as for every peer)

    meta = common.load_meta(a.data)
    ep_of = common.sample_episode(meta)
    t0 = common.clock()
    order = np.random.default_rng(a.seed).permutation(len(ep_of))
    return common.train_epoch(_run(_pipe(a.out, order)), lambda b: b["idx"].tolist(), ep_of, t0)


def pinned(a: argparse.Namespace) -> dict:
    import nvidia.dali  # noqa: F401

    e = common.load_meta(a.data)["episodes"][a.episode]
    r0, t0 = common.rchar(), time.perf_counter()
    n = sum(len(b["idx"]) for b in _run(_pipe(a.out, np.arange(e["first"], e["first"] + e["length"]), threads=1)))
    return {"seconds": time.perf_counter() - t0, "rchar": common.rchar() - r0, "frames": n,
            "how": "the episode's offsets, in order, through the same pipeline, 1 thread (memory-mapped file)"}


if __name__ == "__main__":
    common.main({"convert": convert, "train": train, "pinned": pinned})
