"""episodepipes: `write_shards` (2 workers) and `train_pipe` / `video_pipe` (2 decode threads)."""

from __future__ import annotations

import argparse
import pickle
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the worktree, when not installed
import common  # noqa: E402

SHARD_BYTES = 8_000_000
_FRAMES: dict[str, tuple] = {}  # loaded in the parent before the encoder processes fork


@dataclass(frozen=True)
class NpyReader:
    """An `EpisodeReader` over DATA's frames (RGB) and state."""

    data: str

    def _get(self) -> tuple:
        if self.data not in _FRAMES:
            _FRAMES[self.data] = common.load(Path(self.data))
        return _FRAMES[self.data]

    def episode_ids(self) -> list[str]:
        return [e["id"] for e in self._get()[2]["episodes"]]

    def read(self, episode_id: str):  # noqa: ANN201
        from episodepipes.sharding.episode import EpisodeData

        frames, state, meta = self._get()
        e = next(e for e in meta["episodes"] if e["id"] == episode_id)
        sl = slice(e["first"], e["first"] + e["length"])
        return EpisodeData(episode_id, {c: list(frames[sl, k]) for k, c in enumerate(common.CAMERAS)},
                           {"state": state[sl]}, meta["fps"], "task", "train")


def _jpeg_digest(out: Path) -> str:
    from episodepipes.index import EpisodeIndex
    from episodepipes.pipes import ShardReader
    from episodepipes.pipes.plan import Item

    idx, d = EpisodeIndex.open(out), common.JpegDigest()
    items = [Item(e.id, f) for e in idx.episodes for f in range(e.length)]
    for r in ShardReader(idx, items):
        for c in common.CAMERAS:
            d.add(bytes(r.members[f"{c}.jpg"]))
    return d.hexdigest()


def convert(a: argparse.Namespace) -> dict:
    from episodepipes.sharding.write import WriteOptions, write_shards

    reader = NpyReader(str(a.data))
    reader.episode_ids()  # load the frames before the timer and before the fork
    t0 = time.perf_counter()
    write_shards(reader, a.out, WriteOptions(format="bench", shard_size=SHARD_BYTES), workers=2)
    t = time.perf_counter() - t0
    return {"convert_s": t, "bytes": common.du(a.out), "jpeg_digest": _jpeg_digest(a.out),
            "how": "write_shards(workers=2), JPEG q90 by cv2", "versions": common.versions("episodepipes", "torchdata")}


def _ids(meta: dict):  # noqa: ANN202
    first = {e["id"]: e["first"] for e in meta["episodes"]}
    return lambda b: [first[e] + int(f) for e, f in zip(b["episode"], b["frame"])]


def _pipe(a: argparse.Namespace):  # noqa: ANN202
    from episodepipes.pipes.train import train_pipe

    return train_pipe(str(a.out), batch_size=common.BATCH, seed=a.seed, rank=0, world_size=1,
                      num_workers=common.WORKERS, method=a.method)


def train(a: argparse.Namespace) -> dict:
    import episodepipes.pipes.train  # noqa: F401  (imports before the timer, as for every peer)

    meta = common.load_meta(a.data)
    t0 = common.clock()
    pipe = _pipe(a)
    return common.train_epoch(pipe, _ids(meta), common.sample_episode(meta), t0)


def pinned(a: argparse.Namespace) -> dict:
    from episodepipes.pipes import video_pipe

    meta = common.load_meta(a.data)
    e = meta["episodes"][a.episode]
    r0, t0 = common.rchar(), time.perf_counter()
    pipe = video_pipe(str(a.out), episodes=[e["id"]], batch_size=common.BATCH, max_batches=10**6,
                      num_workers=common.WORKERS)
    n = sum(len(b["episode"]) for b in pipe)
    return {"seconds": time.perf_counter() - t0, "rchar": common.rchar() - r0, "frames": n,
            "bytes_read_stat": pipe.stats["bytes_read"],
            "how": "video_pipe(episodes=[e]): byte ranges from the index, 2 decode threads"}


def resume_save(a: argparse.Namespace) -> dict:
    return common.resume_save(_pipe(a), _ids(common.load_meta(a.data)), a, "ours", pickle.dumps)


def resume_load(a: argparse.Namespace) -> dict:
    return common.resume_load(_pipe(a), _ids(common.load_meta(a.data)), a, "ours", pickle.loads)


if __name__ == "__main__":
    common.main({"convert": convert, "train": train, "pinned": pinned, "resume-save": resume_save,
                 "resume-load": resume_load})
