"""Index open time with wide arrays: what the statistics in ``index.json`` cost to parse and to check.

Writes ``--episodes`` synthetic episodes (two splits) with ``--arrays`` float32 arrays of ``--dims`` elements
per step, with their statistics, then times (best of ``--repeat``) ``json.loads`` of the index, the check of
its ``stats`` field (`statsfields.load`) and the whole `EpisodeIndex.open`.

    python benchmarks/bench_stats_open.py                       # 1,000 dims x 10 arrays
    python benchmarks/bench_stats_open.py --dims 100 --arrays 4
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from episodepipes.index import EpisodeIndex
from episodepipes.sharding.encode import EncodeOptions, encode_episode
from episodepipes.sharding.synthetic import SyntheticReader
from episodepipes.sharding.writer import ShardWriter
from episodepipes.statsfields import StatsFields, episode_part
from episodepipes.statsfields import load as load_stats


def write(out: Path, *, dims: int, arrays: int, episodes: int, length: int) -> Path:
    reader = SyntheticReader(num_episodes=episodes, length=length, height=16, width=16)
    rng = np.random.default_rng(0)
    fields = StatsFields()
    with ShardWriter(out, shard_size=1 << 26, options={"jpeg_quality": 90}) as w:
        for eid in reader.episode_ids():
            values = {f"a{k}": rng.standard_normal((length, dims)).astype(np.float32) for k in range(arrays)}
            ep = dataclasses.replace(reader.read(eid), arrays=values)
            w.add(encode_episode(ep, EncodeOptions()))
            fields.add(ep.split, *episode_part(eid, values))
        w.extra = fields.to_json()  # what write_shards stores: every (split, key)'s statistics
    return out


def best(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dims", type=int, default=1000)
    ap.add_argument("--arrays", type=int, default=10)
    ap.add_argument("--episodes", type=int, default=6)
    ap.add_argument("--length", type=int, default=40)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = write(Path(tmp) / "s", dims=a.dims, arrays=a.arrays, episodes=a.episodes, length=a.length)
        raw = (out / "index.json").read_bytes()
        data = json.loads(raw)
        parse = best(lambda: json.loads(raw), a.repeat)
        check = best(lambda: load_stats(data, where="index.json"), a.repeat)
        total = best(lambda: EpisodeIndex.open(out), a.repeat)
    print(f"{a.dims} dims x {a.arrays} arrays, {a.episodes} episodes x {a.length} steps: index.json "
          f"{len(raw) / 1e6:.1f} MB; json.loads {parse:.3f} s, stats check {check:.3f} s, "
          f"EpisodeIndex.open {total:.3f} s")


if __name__ == "__main__":
    main()
