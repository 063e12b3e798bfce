"""Index open time with wide arrays: the statistics in the side file ``index.stats.bin`` against ``index.json``.

Writes ``--episodes`` synthetic episodes (two splits) with ``--arrays`` float32 arrays of ``--dims`` elements
per step, with their statistics, twice: as the writer stores them (side file) and inline in ``index.json`` (as
episodepipes did before the side file). Then times, best of ``--repeat``: `EpisodeIndex.open` of each, the first
`EpisodeIndex.stats` call on a fresh open (reading and checking every statistic), the side file's encoding,
and what a progress save pays for statistics: one finished episode's record now, ``json.dumps`` of all before.

    python benchmarks/bench_stats_open.py                       # 1,000 dims x 10 arrays, 6 x 40 steps
    python benchmarks/bench_stats_open.py --episodes 3 --length 1000
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
from episodepipes.normstats import sidefile as statsfile
from episodepipes.normstats.fields import StatsFields, episode_part
from episodepipes.sharding.formats.synthetic import SyntheticReader
from episodepipes.sharding.write.encode import EncodeOptions, encode_episode
from episodepipes.sharding.write.writer import ShardWriter


def write(out: Path, *, dims: int, arrays: int, episodes: int, length: int, inline: bool) -> tuple[StatsFields, tuple]:
    """The output's statistics, and its last episode's part (split, statistics, failures)."""
    reader = SyntheticReader(num_episodes=episodes, length=length, height=16, width=16)
    rng = np.random.default_rng(0)
    fields = StatsFields()
    with ShardWriter(out, shard_size=1 << 26, options={"jpeg_quality": 90}) as w:
        for eid in reader.episode_ids():
            values = {f"a{k}": rng.standard_normal((length, dims)).astype(np.float32) for k in range(arrays)}
            ep = dataclasses.replace(reader.read(eid), arrays=values)
            w.add(encode_episode(ep, EncodeOptions()))
            part = (ep.split, *episode_part(eid, values))
            fields.add(*part)
        out.mkdir(parents=True, exist_ok=True)
        w.extra = fields.to_json() if inline else fields.write(out / statsfile.NAME)  # as write_shards stores them
    return fields, part


def best(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def first_stats(out: Path, repeat: int) -> float:
    """Best time of the first `EpisodeIndex.stats` call, each on a fresh open (which reads and checks them all)."""
    fresh = iter([EpisodeIndex.open(out) for _ in range(repeat)])
    return best(lambda: next(fresh).stats("a0"), repeat)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dims", type=int, default=1000)
    ap.add_argument("--arrays", type=int, default=10)
    ap.add_argument("--episodes", type=int, default=6)
    ap.add_argument("--length", type=int, default=40)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    shape = dict(dims=a.dims, arrays=a.arrays, episodes=a.episodes, length=a.length)
    with tempfile.TemporaryDirectory() as tmp:
        new, old = Path(tmp) / "side", Path(tmp) / "inline"
        fields, (split, stats, failed) = write(new, **shape, inline=False)
        write(old, **shape, inline=True)
        sizes = {d: (d / "index.json").stat().st_size for d in (new, old)}
        side = (new / statsfile.NAME).stat().st_size
        opens = {d: best(lambda d=d: EpisodeIndex.open(d), a.repeat) for d in (new, old)}
        first = {d: first_stats(d, a.repeat) for d in (new, old)}
        enc = best(lambda: statsfile.encode(fields.stats, fields.missing), a.repeat)
        part = best(lambda: statsfile.encode({(split, k): v for k, v in stats.items()},
                                             {(split, k): r for k, r in failed.items()}), a.repeat)
        dump = best(lambda: json.dumps(fields.to_json(), sort_keys=True), a.repeat)
    print(f"{a.dims} dims x {a.arrays} arrays, {a.episodes} episodes x {a.length} steps, best of {a.repeat}:")
    print(f"  side file: index.json {sizes[new] / 1e6:.3f} MB + {statsfile.NAME} {side / 1e6:.1f} MB; "
          f"EpisodeIndex.open {opens[new]:.3f} s; first stats() {first[new]:.3f} s; encode all {enc:.3f} s; "
          f"a progress save's record for one finished episode {part:.3f} s")
    print(f"  inline:    index.json {sizes[old] / 1e6:.1f} MB; EpisodeIndex.open {opens[old]:.3f} s; "
          f"first stats() {first[old]:.3f} s; a progress save (json.dumps of all) {dump:.3f} s")

if __name__ == "__main__":
    main()
