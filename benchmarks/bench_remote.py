"""Reading a pass's frames from a local S3 server (moto) through a latency-injecting proxy, against local disk.

For each injected per-request latency, three access patterns of a validation/training pass are read through
`RemoteSource.read_ranges` and through `LocalSource` (same calls, same ranges):

- ``episode``: every frame of each episode, one call per episode and shard (a pinned video pipe);
- ``every 4th``: every 4th frame of each episode, one call per episode and shard (a metric subsample);
- ``pass``: all frames of the pass, one call per shard (a reader that plans a whole pass).

Reported: frames per second for both, reads alone and reads feeding two JPEG-decode threads through a
bounded queue (what a pipe with prefetch does), the ratios, the body bytes that crossed the proxy against
the frames' own bytes, and the GET count. moto and the proxies run in a child process.
Run: ``python benchmarks/bench_remote.py [--quick]``.
"""

from __future__ import annotations

import argparse
import os
import queue
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


Calls = list[tuple[str, list[tuple[int, int]]]]


def _plans(index: object) -> dict[str, Calls]:
    """Per pattern, the list of read_ranges calls ``(shard name, ranges)`` in the order a reader makes them."""

    def per_episode(step: int) -> list[tuple[str, list[tuple[int, int]]]]:
        calls = []
        for ep in index.episodes:  # type: ignore[attr-defined]
            by: dict[str, list[tuple[int, int]]] = {}
            for f in range(0, ep.length, step):
                shard, a, b = ep.frame_range(f)
                by.setdefault(index.shards[shard].name, []).append((a, b - a))  # type: ignore[attr-defined]
            calls += list(by.items())
        return calls

    whole: dict[str, list[tuple[int, int]]] = {}
    for name, rs in per_episode(1):
        whole.setdefault(name, []).extend(rs)
    return {"episode": per_episode(1), "every 4th": per_episode(4), "pass": list(whole.items())}


def _time(calls: Calls, read: Callable, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        for name, rs in calls:
            read(name, rs)
        best = min(best, time.perf_counter() - t)
    return best


def _decode_frame(blob: bytes) -> int:
    import io

    import cv2
    import numpy as np
    from webdataset.tariterators import tar_file_iterator

    n = 0
    for m in tar_file_iterator(io.BytesIO(blob)):
        if m["fname"].endswith(".jpg"):
            n += cv2.imdecode(np.frombuffer(m["data"], np.uint8), cv2.IMREAD_COLOR) is not None
    return n


def _time_pipelined(calls: Calls, read: Callable, decoders: int = 2, depth: int = 64) -> float:
    """One reader thread feeding ``decoders`` decode threads through a bounded queue, as a pipe with prefetch."""
    q: queue.Queue[bytes | None] = queue.Queue(depth)

    def decode() -> None:
        while (blob := q.get()) is not None:
            _decode_frame(blob)

    threads = [threading.Thread(target=decode) for _ in range(decoders)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for name, rs in calls:
        for blob in read(name, rs):
            q.put(blob)
    for _ in threads:
        q.put(None)
    for th in threads:
        th.join()
    return time.perf_counter() - t


LATENCIES = (0.0, 0.02, 0.05)


def run(workdir: Path, quick: bool = False) -> dict:
    sys.path.insert(0, str(ROOT / "tests"))
    from s3server import ServerProcess, s3_env, set_env

    from episodepipes.index import EpisodeIndex
    from episodepipes.remote import RemoteOptions, RemoteSource
    from episodepipes.sharding.synthetic import SyntheticReader
    from episodepipes.sharding.write import WriteOptions, write_shards
    from episodepipes.shardio import LocalSource

    out = Path(workdir) / "shards"
    reader = SyntheticReader(num_episodes=4 if quick else 8, length=40, height=240, width=320)
    write_shards(reader, out, WriteOptions(format="bench", shard_size=3_000_000))
    index = EpisodeIndex.open(out)
    servers = ServerProcess(LATENCIES)
    servers.upload_dir(out, "bench", "ds")
    local = LocalSource(out)
    rows = []
    try:
        for i, latency in enumerate(LATENCIES):
            set_env(s3_env(servers.endpoints[i]))
            for pattern, calls in _plans(index).items():
                frames = sum(len(rs) for _, rs in calls)
                own = sum(n for _, rs in calls for _, n in rs)
                src = RemoteSource("s3://bench/ds", RemoteOptions())
                src.read_ranges(calls[0][0], calls[0][1][:1])  # connect once, outside the timing
                servers.reset(i)
                t_remote = _time(calls, src.read_ranges, 1)
                gets, body = servers.stats(i)
                t_local = _time(calls, local.read_ranges, 3)
                p_local = min(_time_pipelined(calls, local.read_ranges) for _ in range(2))
                p_remote = _time_pipelined(calls, src.read_ranges)
                rows.append({"latency_ms": round(latency * 1000), "pattern": pattern, "frames": frames,
                             "mb": own / 1e6, "local_fps": frames / t_local, "remote_fps": frames / t_remote,
                             "read_ratio": t_local / t_remote, "decoded_local_fps": frames / p_local,
                             "decoded_remote_fps": frames / p_remote, "decoded_ratio": p_local / p_remote,
                             "bytes_ratio": body / own, "gets": gets})
                src.close()
    finally:
        servers.close()
    return {"rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="half the episodes")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    with tempfile.TemporaryDirectory() as d:
        res = run(Path(d), args.quick)
    print("frames per second: reads alone (read_ranges), and reads feeding 2 JPEG-decode threads")
    print(f"{'latency':>8} {'pattern':>10} {'frames':>6} {'MB':>5} | {'read local':>10} {'remote':>7} {'ratio':>6} | "
          f"{'+decode local':>13} {'remote':>7} {'ratio':>6} | {'bytes':>6} {'GETs':>5}")
    for r in res["rows"]:
        print(f"{r['latency_ms']:>6}ms {r['pattern']:>10} {r['frames']:>6} {r['mb']:>5.1f} | "
              f"{r['local_fps']:>10.0f} {r['remote_fps']:>7.0f} {r['read_ratio']:>6.3f} | "
              f"{r['decoded_local_fps']:>13.0f} {r['decoded_remote_fps']:>7.0f} {r['decoded_ratio']:>6.2f} | "
              f"{r['bytes_ratio']:>5.2f}x {r['gets']:>5}")
    print(f"({os.cpu_count()} cores; moto and the proxy run in a child process on this machine)")


if __name__ == "__main__":
    main()
