"""MosaicML Streaming: ``MDSWriter`` (single process) and ``StreamingDataset`` + ``StreamingDataLoader``."""

from __future__ import annotations

import argparse
import time

import common

SHARD_BYTES = 8_000_000
COLUMNS = {"idx": "int", "front": "bytes", "wrist": "bytes", "state": "ndarray:float32:7"}


def _clean() -> None:
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()  # a previous process's shared memory would make this one refuse the local dir


def _dataset(out, **kw):  # noqa: ANN001, ANN202
    from streaming import StreamingDataset

    class Decoded(StreamingDataset):
        def __getitem__(self, i: int) -> dict:
            return common.tensors(super().__getitem__(i))

    _clean()
    return Decoded(local=str(out), batch_size=common.BATCH, **kw)


def convert(a: argparse.Namespace) -> dict:
    from streaming import MDSWriter, StreamingDataset

    frames, state, meta = common.load(a.data)
    t0 = time.perf_counter()
    with MDSWriter(out=str(a.out), columns=COLUMNS, size_limit=SHARD_BYTES) as w:
        for i in range(len(frames)):
            w.write({"idx": i, "front": common.jpeg(frames[i, 0]), "wrist": common.jpeg(frames[i, 1]),
                     "state": state[i]})
    t = time.perf_counter() - t0
    size = common.du(a.out)
    _clean()
    ds, d = StreamingDataset(local=str(a.out), shuffle=False, batch_size=1), common.JpegDigest()
    for i in range(ds.num_samples):
        s = ds.get_item(i)
        assert s["idx"] == i
        for c in common.CAMERAS:
            d.add(s[c])
    return {"convert_s": t, "bytes": size, "jpeg_digest": d.hexdigest(), "how": "MDSWriter, 1 process, no compression",
            "versions": common.versions("streaming", "torchvision")}


def _loader(ds):  # noqa: ANN001, ANN202
    from streaming import StreamingDataLoader

    return StreamingDataLoader(ds, batch_size=common.BATCH, num_workers=common.WORKERS)


def train(a: argparse.Namespace) -> dict:
    import streaming  # noqa: F401  (imports before the timer, as for every peer)

    meta = common.load_meta(a.data)
    t0 = common.clock()
    loader = _loader(_dataset(a.out, shuffle=True, shuffle_seed=a.seed))
    return common.train_epoch(loader, common.idx_of, common.sample_episode(meta), t0)


def pinned(a: argparse.Namespace) -> dict:
    meta = common.load_meta(a.data)
    e = meta["episodes"][a.episode]
    import streaming  # noqa: F401  (imports read files too: not the dataset's cost)

    r0, t0 = common.rchar(), time.perf_counter()
    ds = _dataset(a.out, shuffle=False)
    n = sum(1 for i in range(e["first"], e["first"] + e["length"]) if ds[i] is not None)
    return {"seconds": time.perf_counter() - t0, "rchar": common.rchar() - r0, "frames": n,
            "how": "ds[i] for the episode's sample numbers, 1 thread (kept by the user: MDS has no episode index)"}


def resume_save(a: argparse.Namespace) -> dict:
    loader = _loader(_dataset(a.out, shuffle=True, shuffle_seed=a.seed))
    return common.resume_save(loader, common.idx_of, a, "mosaic")


def resume_load(a: argparse.Namespace) -> dict:
    loader = _loader(_dataset(a.out, shuffle=True, shuffle_seed=a.seed))
    return common.resume_load(loader, common.idx_of, a, "mosaic")


if __name__ == "__main__":
    common.main({"convert": convert, "train": train, "pinned": pinned, "resume-save": resume_save,
                 "resume-load": resume_load})
