"""MosaicML Streaming: ``MDSWriter`` (single process) and ``StreamingDataset`` + ``StreamingDataLoader``."""

from __future__ import annotations

import argparse
import json
import time

import common
import numpy as np
import torch

SHARD_BYTES = 8_000_000
COLUMNS = {"idx": "int", "front": "bytes", "wrist": "bytes", "state": "ndarray:float32:7"}


def _clean() -> None:
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()  # a previous process's shared memory would make this one refuse the local dir


def _dataset(out, **kw):  # noqa: ANN001, ANN202
    from streaming import StreamingDataset

    class Decoded(StreamingDataset):
        def __getitem__(self, i: int) -> dict:
            s = super().__getitem__(i)
            return {"idx": int(s["idx"]), "state": torch.from_numpy(np.array(s["state"])),
                    **{c: torch.from_numpy(common.decode_rgb(s[c])).permute(2, 0, 1) for c in common.CAMERAS}}

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


def _ids(b: dict) -> list[int]:
    return b["idx"].tolist()


def train(a: argparse.Namespace) -> dict:
    import streaming  # noqa: F401  (imports before the timer, as for every peer)

    meta = common.load_meta(a.data)
    t0 = time.perf_counter()
    loader = _loader(_dataset(a.out, shuffle=True, shuffle_seed=a.seed))
    return common.train_epoch(loader, _ids, common.sample_episode(meta), t0)


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
    seen: list[int] = []
    it = iter(loader)
    for _ in range(a.stop_after):
        seen += _ids(next(it))
    (a.out.parent / "mosaic.state").write_text(json.dumps(loader.state_dict()))
    for b in it:
        seen += _ids(b)
    (a.out.parent / "mosaic.reference").write_text(",".join(map(str, seen)))
    return {"saved_after": a.stop_after}


def resume_load(a: argparse.Namespace) -> dict:
    loader = _loader(_dataset(a.out, shuffle=True, shuffle_seed=a.seed))
    loader.load_state_dict(json.loads((a.out.parent / "mosaic.state").read_text()))
    got = [i for b in loader for i in _ids(b)]
    ref = [int(x) for x in (a.out.parent / "mosaic.reference").read_text().split(",")]
    return common.resume_check(ref, got, a.stop_after * common.BATCH)


if __name__ == "__main__":
    common.main({"convert": convert, "train": train, "pinned": pinned, "resume-save": resume_save,
                 "resume-load": resume_load})
