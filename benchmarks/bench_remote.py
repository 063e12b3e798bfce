"""Remote roots: the pipes on ``s3://`` (moto behind a proxy adding per-request latency) against local disk.

For each injected latency (20 and 50 ms per request, a same-region to cross-region object store), the
same pipe runs on the local folder and on the S3 root in alternation (paired repeats: the ratio of each
pair, then the median and range of the ratios), on the same 224x224 two-camera JPEG frames:

- ``open pass``: `video_pipe` over every episode (the rank-0 render pass: a sequential plan);
- ``train``: one shuffled epoch of `train_pipe` (random single frames: one ranged GET per frame, in batches);
- ``train, whole shards``: the same epoch with ``RemoteOptions(cache_dir=..., cache_whole=True)``, each run
  with an empty cache (one GET per shard, every shard of a batch side by side; later epochs read locally);
- ``train, block shuffle``: the same epoch in the block order (``shuffle="block"``, 64-frame blocks, windows
  of 8 blocks), against the same block order on local disk: one GET per block, a window ahead;
- ``train, block shuffle, whole shards``: that order with the cold whole-shard cache (a window's shards
  download while the previous window decodes);
- ``block shuffle, rank 0 of 2`` (bytes only, not timed): what one of two ranks transfers, against its own
  frames' bytes, alone and with the two ranks (threads of one process) sharing one ``cache_dir``;
- ``metric``: a sparse `metric_pipe` plan (a few frames per episode: gaps between them are skipped or
  read through, by the coalescing threshold).

``episodes / batch`` is the shuffle's mix: the distinct episodes in a batch of 32, averaged over the epoch
(`peers.common.train_epoch`, as the peers section measures it).
Bytes are the response bodies that crossed the proxy, against the frames' own bytes (the index's ranges).
moto and the proxies run in a child process, so their CPU is not the client's (on a 2-core machine they
still compete for it). ``server GETs/s`` is what that server sustains for single-frame GETs (64 in flight):
a train pass needs one GET per frame, so its remote frames/s cannot exceed it, whatever the client does.
``server MB/s`` is what it sustains for the block shuffle's GETs (64 frames of one shard each, 8 in flight, one
epoch's bytes), as frames/s too, with the server CPU those bytes cost: the bandwidth a block-order pass can draw.
The CPU columns split the cost: this process's CPU per frame on each side (what the pipe itself spends), and
the server's CPU per s3 pass, which on this 2-core machine is taken from the pipe's cores, as a real object
store's is not.
``open`` (a table of its own): what `EpisodeIndex.open` of a remote root fetches, counted at a proxy in this process
in front of moto (child process, 20 ms per request), on synthetic indexes laid out as the writer lays them out
(`scale_index`: 50 KB frames, 512 MB shards, ids and attributes as columns; the shards are not uploaded: open reads
none) from 10^6 to 10^8 frames: requests and bytes
at open (per-frame columns are read by range on use; what open reads grows with episodes and shards only), the
process's resident memory growth, and what the first frame lookup then fetches (its rows' block of every per-frame
column).
(A ``--codec reference`` index whose dataset lies on S3: the reference section's rows, `benchmarks.lerobot_s3`.)
Run: ``python scripts/bench.py remote [--quick]``; the open table alone: ``python benchmarks/bench_remote.py --open``.
"""

from __future__ import annotations

import itertools
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LATENCIES = (0.02, 0.05)
BATCH = 32
METRIC_FRAMES = 6
BLOCK = {"shuffle": "block", "block_frames": 64, "window_blocks": 8}


def _count(pipe: object) -> int:
    return sum(len(b["episode"]) for b in pipe)  # type: ignore[attr-defined]


def _cpu_of(pid: int) -> float:
    """CPU seconds (user + system, all threads) of process ``pid`` so far, from /proc (Linux; 0 elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _paired(local: Callable[[], int], remote: Callable[[], int], repeat: int,
            stats: Callable[[], tuple[int, int]], server: Callable[[], float]) -> dict:
    """``repeat`` (local, remote) pairs: frames/s of each, the ratio per pair, GETs and bytes of one remote run,
    and CPU: this process's per frame on each side, and the S3 server's (moto and the proxies) per remote pass."""
    pairs, gets, body, cpu = [], 0, 0, []
    for _ in range(repeat):
        c, t = time.process_time(), time.perf_counter()
        n = local()
        t_local, c_local = time.perf_counter() - t, time.process_time() - c
        stats()  # reset the proxy's counters
        srv, c, t = server(), time.process_time(), time.perf_counter()
        m = remote()
        t_remote, c_remote, srv = time.perf_counter() - t, time.process_time() - c, server() - srv
        gets, body = stats()
        pairs.append((n / t_local, m / t_remote))
        cpu.append((c_local / n, c_remote / m, srv))
    ratios = [r / lo for lo, r in pairs]
    return {"local_fps": statistics.median(p[0] for p in pairs), "remote_fps": statistics.median(p[1] for p in pairs),
            "ratio": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
            "gets": gets, "body": body, "frames": m,
            "cpu_local": statistics.median(x[0] for x in cpu), "cpu_remote": statistics.median(x[1] for x in cpu),
            "server_cpu": statistics.median(x[2] for x in cpu)}


def _own_bytes(index: object, items: list[tuple[str, int]]) -> int:
    total = 0
    for eid, f in items:
        _, a, b = index.episode(eid).frame_range(f)  # type: ignore[attr-defined]
        total += b - a
    return total


def _mix(index: object, **kw: object) -> float:
    """Distinct episodes per batch of one local epoch of ``train_pipe(index, **kw)`` (the peers' measure)."""
    import numpy as np

    from benchmarks.peers.common import clock, train_epoch
    from episodepipes.pipes.train import train_pipe

    eps = index.split("train")  # type: ignore[attr-defined]
    first = dict(zip((e.id for e in eps), itertools.accumulate([0, *(e.length for e in eps)])))
    ep_of = np.repeat(np.arange(len(eps)), [e.length for e in eps])
    built = clock()
    pipe = train_pipe(index, batch_size=BATCH, seed=0, rank=0, world_size=1, num_workers=2, **kw)  # type: ignore
    got = train_epoch(pipe, lambda b: [first[e] + f for e, f in zip(b["episode"], b["frame"].tolist())], ep_of,
                      built)
    return got["distinct_episodes_per_batch"]


def _rank_bytes(url: str, stats: Callable[[], tuple[int, int]], own: int, cache: Path | None) -> float:
    """Bytes rank 0 of 2 transfers in one block-order epoch, against its own frames' bytes; with ``cache``, both
    ranks run at once (threads) on one shared ``cache_dir`` and their total over the two ranks' own counts."""
    from episodepipes.index import EpisodeIndex
    from episodepipes.pipes.train import train_pipe
    from episodepipes.remote import RemoteOptions

    def rank(r: int) -> None:
        opts = RemoteOptions() if cache is None else RemoteOptions(cache_dir=cache)
        _count(train_pipe(EpisodeIndex.open(url, options=opts), batch_size=BATCH, seed=0, rank=r, world_size=2,
                          num_workers=1, **BLOCK))  # type: ignore[arg-type]

    stats()
    if cache is None:
        rank(0)
        return stats()[1] / (own / 2)
    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return stats()[1] / own


def _server_ceiling(url: str, index: object, n: int = 400) -> float:
    """Single-frame GETs per second the server answers with 64 in flight (gap 0: one GET per frame)."""
    from episodepipes.remote import RemoteOptions, RemoteSource

    calls = []
    for ep in index.episodes:  # type: ignore[attr-defined]
        for f in range(ep.length):
            shard, a, b = ep.frame_range(f)
            calls.append((index.shards[shard].name, [(a, b - a)]))  # type: ignore[attr-defined]
    calls = calls[:n]
    with RemoteSource(url, RemoteOptions(max_in_flight=64, gap=0)) as src:
        src.read_many(calls[:8])
        t = time.perf_counter()
        src.read_many(calls)
        return len(calls) / (time.perf_counter() - t)


def _server_bandwidth(url: str, index: object, server: Callable[[], float], *, frames: int = 64,
                      in_flight: int = 8) -> tuple[float, float, int]:
    """(MB/s, the server's CPU seconds, GETs) for every frame of the dataset read as the block shuffle reads it:
    one ranged GET per ``frames`` consecutive frames of one shard, ``in_flight`` (a window's blocks) at once."""
    from episodepipes.remote import RemoteOptions, RemoteSource

    calls = []
    for ep in index.episodes:  # type: ignore[attr-defined]
        spans = [ep.frame_range(f) for f in range(ep.length)]
        for k in range(0, len(spans), frames):
            for shard, run in itertools.groupby(spans[k:k + frames], key=lambda x: x[0]):  # an episode may span two
                run = list(run)
                calls.append((index.shards[shard].name, [(run[0][1], run[-1][2] - run[0][1])]))  # type: ignore
    with RemoteSource(url, RemoteOptions(max_in_flight=in_flight, gap=0, max_request=1 << 30)) as src:
        src.read_many(calls[:in_flight])
        cpu, t = server(), time.perf_counter()
        got = src.read_many(calls)
        dt, cpu = time.perf_counter() - t, server() - cpu
    return sum(len(g[0]) for g in got) / dt / 1e6, cpu, len(calls)


OPEN_SIZES = ((10**4, 10**6), (10**4, 10**7), (10**4, 10**8), (10**6, 10**8))  # (episodes, frames)


def _rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def open_costs(workdir: Path, quick: bool) -> dict:
    """Requests, bytes, seconds and memory of opening a remote index, then of its first frame lookup (see above)."""
    import gc
    import shutil

    sys.path.insert(0, str(ROOT / "tests"))
    from s3server import FaultProxy, ServerProcess, restore_env, s3_env, set_env

    from benchmarks import scale_index
    from episodepipes.index import EpisodeIndex

    sizes = OPEN_SIZES[:2] if quick else OPEN_SIZES
    servers = ServerProcess((0.02,))
    proxy = FaultProxy(servers.endpoints[0])
    old = set_env(s3_env(proxy.endpoint))
    rows, table = [], []
    try:
        for episodes, frames in sizes:
            local = scale_index.make(Path(workdir) / f"open-{episodes}-{frames}", episodes, length=frames // episodes)
            for shard in local.glob("*.tar"):  # sparse files (5 TB on paper at 10^8 frames): open reads none of them
                shard.unlink()
            columns = sum(p.stat().st_size for p in local.glob("index.*.npy"))
            meta = (local / "index.json").stat().st_size
            servers.upload_dir(local, "bench", f"open-{episodes}-{frames}")
            shutil.rmtree(local)
            gc.collect()
            proxy.reset()
            rss, t = _rss(), time.perf_counter()
            index = EpisodeIndex.open(f"s3://bench/open-{episodes}-{frames}")
            dt, grew = time.perf_counter() - t, _rss() - rss
            n_open, b_open = len(proxy.requests), proxy.body_bytes
            proxy.reset()
            index.episodes[episodes // 2].frame_range(0)
            n_look, b_look = len(proxy.requests), proxy.body_bytes
            table.append([f"{episodes:.0e}", f"{frames:.0e}", f"{meta / 1e6:.2f} MB + {columns / 1e6:,.1f} MB",
                          n_open, f"{b_open / 1e6:.2f} MB", f"{dt:.2f} s", f"{grew / 1e6:,.0f} MB", n_look,
                          f"{b_look / 1e3:.0f} kB"])
            rows.append({"metric": f"remote open at {episodes:.0e} episodes, {frames:.0e} frames: bytes fetched",
                         "ours": b_open, "baseline": meta + columns, "ceiling": None, "unit": "bytes",
                         "note": f"{n_open} requests, {dt:.2f} s, RSS +{grew / 1e6:,.0f} MB; the first lookup: "
                                 f"{n_look} requests, {b_look} bytes; baseline: index.json and every column whole"})
            del index
    finally:
        proxy.close()
        servers.close()
        restore_env(old)
    return {"rows": rows, "table": {
        "title": "remote open: what EpisodeIndex.open fetches (moto in a child, 20 ms a request; 512 MB shards)",
        "columns": ["episodes", "frames", "index.json + columns", "requests at open", "bytes at open", "open",
                    "RSS growth", "first lookup: requests", "first lookup: bytes"], "rows": table}}


def run(workdir: Path, quick: bool) -> dict:
    sys.path.insert(0, str(ROOT / "tests"))
    from s3server import ServerProcess, s3_env, set_env

    from benchmarks.bench_train import make_data
    from episodepipes.index import EpisodeIndex
    from episodepipes.pipes import metric_pipe, video_pipe
    from episodepipes.pipes.plan import metric_items
    from episodepipes.pipes.train import train_pipe
    from episodepipes.remote import RemoteOptions

    eps, length = (8, 60) if quick else (24, 150)
    repeat = 3 if quick else 4
    local = make_data(Path(workdir) / "shards", episodes=eps, length=length)
    ids = [e.id for e in local.episodes]
    every = [(e.id, f) for e in local.episodes for f in range(e.length)]
    sparse = [(i.episode, i.frame) for i in metric_items(local.split("train"), METRIC_FRAMES)]
    own = {"open pass": _own_bytes(local, every), "metric": _own_bytes(local, sparse)}
    for name in ("train", "train, whole shards", "train, block shuffle", "train, block shuffle, whole shards"):
        own[name] = _own_bytes(local, every)
    mix = {"train": _mix(local), "train, block shuffle": _mix(local, **BLOCK)}
    servers = ServerProcess(LATENCIES)
    rows, table = [], []
    runs = itertools.count()  # a fresh cache folder per cold run
    try:
        servers.upload_dir(local.root, "bench", "ds")
        for i, latency in enumerate(LATENCIES):
            set_env(s3_env(servers.endpoints[i]))
            remote = EpisodeIndex.open("s3://bench/ds")  # one source (its connections) for every pipe and pass
            ms = round(latency * 1000)
            ceiling = _server_ceiling("s3://bench/ds", local)
            table.append([f"{ms} ms", "server GETs/s", "", "", f"{ceiling:,.0f}", "", "", "", "", "", ""])
            mbs, srv_cpu, n_gets = _server_bandwidth("s3://bench/ds", local, lambda: _cpu_of(servers.pid))
            frame_bytes = own["train"] / sum(e.length for e in local.episodes)
            table.append([f"{ms} ms", "server MB/s (64-frame GETs, 8 in flight)", "", "",
                          f"{mbs:,.0f} MB/s = {mbs * 1e6 / frame_bytes:,.0f} frames/s", "", "", n_gets, "", "",
                          f"{srv_cpu:.2f}"])
            rows.append({"metric": f"server MB/s at {ms} ms per request, the block shuffle's GETs", "ours": mbs,
                         "baseline": None, "ceiling": None, "unit": "MB/s",
                         "note": f"{n_gets} GETs of 64 frames, 8 in flight, through the latency proxy: "
                                 f"{mbs * 1e6 / frame_bytes:,.0f} frames/s; the server (moto + proxies) spent "
                                 f"{srv_cpu:.2f} CPU s on the epoch's bytes"})

            def stats(i: int = i) -> tuple[int, int]:
                got = servers.stats(i)
                servers.reset(i)
                return got

            def video(idx: EpisodeIndex) -> Callable[[], int]:
                pipe = video_pipe(idx, episodes=ids, batch_size=BATCH, max_batches=10**6)
                return lambda: _count(pipe)

            def train(idx: EpisodeIndex, **kw: object) -> Callable[[], int]:
                pipe = train_pipe(idx, batch_size=BATCH, seed=0, rank=0, world_size=1, num_workers=2, **kw)
                return lambda: _count(pipe)  # each pass is the next epoch

            def whole(idx: EpisodeIndex, **kw: object) -> Callable[[], int]:
                if not idx.remote:
                    return train(idx, **kw)

                def cold() -> int:  # a fresh, empty cache per run: the epoch downloads every shard
                    opts = RemoteOptions(cache_dir=Path(workdir) / f"cache-{next(runs)}", cache_whole=True)
                    return _count(train_pipe(EpisodeIndex.open("s3://bench/ds", options=opts), batch_size=BATCH,
                                             seed=0, rank=0, world_size=1, num_workers=2, **kw))
                return cold

            def block(idx: EpisodeIndex) -> Callable[[], int]:
                return train(idx, **BLOCK)

            def block_whole(idx: EpisodeIndex) -> Callable[[], int]:
                return whole(idx, **BLOCK)

            def metric(idx: EpisodeIndex) -> Callable[[], int]:
                pipe = metric_pipe(idx, split="train", frames_per_episode=METRIC_FRAMES, batch_size=BATCH,
                                   rank=0, world_size=1)
                return lambda: _count(pipe)

            pipes = [("open pass", video), ("train", train), ("train, whole shards", whole),
                     ("train, block shuffle", block), ("train, block shuffle, whole shards", block_whole),
                     ("metric", metric)]
            for name, make in pipes if i == 0 else [p for p in pipes if p[0] != "train, block shuffle, whole shards"]:
                lo, re = make(local), make(remote)
                re()  # warm: connections, the first GETs
                pairs = min(repeat, 3) if name == "train" else repeat
                res = _paired(lo, re, pairs, stats, lambda: _cpu_of(servers.pid))
                ms = round(latency * 1000)
                bytes_ratio = res["body"] / own[name]
                table.append([f"{ms} ms", name, res["frames"], f"{res['local_fps']:,.0f}", f"{res['remote_fps']:,.0f}",
                              f"{res['ratio']:.2f} ({res['ratio_min']:.2f}-{res['ratio_max']:.2f})",
                              f"{bytes_ratio:.3f}x", res["gets"],
                              f"{mix[name]:.1f}" if name in mix else "",
                              f"{res['cpu_local'] * 1e3:.2f} / {res['cpu_remote'] * 1e3:.2f}",
                              f"{res['server_cpu']:.2f}"])
                rows.append({"metric": f"{name} frames/s at {ms} ms per request, s3 vs local",
                             "ours": res["remote_fps"], "baseline": res["local_fps"], "ceiling": None,
                             "unit": "frames/s", "note": f"ratio per pair {res['ratio_min']:.2f}-{res['ratio_max']:.2f}"
                             f" over {pairs} pairs; bytes {bytes_ratio:.3f}x the frames' own; {res['gets']} GETs; "
                             f"client CPU {res['cpu_local'] * 1e3:.2f} ms/frame local, "
                             f"{res['cpu_remote'] * 1e3:.2f} s3; the S3 server (moto + proxies, same 2 cores) "
                             f"{res['server_cpu']:.2f} CPU s per s3 pass"})
            if i == 0:
                ms = round(latency * 1000)
                for label, cache in (("block shuffle, rank 0 of 2", None),
                                     ("block shuffle, 2 ranks, one cache_dir", Path(workdir) / "cache-ranks")):
                    ratio = _rank_bytes("s3://bench/ds", stats, own["train"], cache)
                    table.append([f"{ms} ms", label, "", "", "", "", f"{ratio:.3f}x", "", "", "", ""])
                    rows.append({"metric": f"{label}: bytes per rank against its own frames' at {ms} ms",
                                 "ours": ratio, "baseline": 1.0, "ceiling": None, "unit": "x",
                                 "note": "every rank reads whole blocks of the same windows"})
            remote.source.close()
    finally:
        servers.close()
    frames = sum(e.length for e in local.episodes)
    opened = open_costs(workdir, quick)
    rows += opened["rows"]
    return {"section": "remote", "intro": __doc__.split("\n\n", 1)[1].split("\nRun:")[0].strip(), "rows": rows,
            "tables": [{"title": f"remote roots: {frames} frames x 2 cameras 224x224 in {len(local.shards)} shards, "
                                 f"batch {BATCH}, 2 decode threads; ratio = s3/local frames/s, median (range) of "
                                 f"{repeat} paired runs (3 for train, bounded by the server's GETs/s; the block "
                                 "shuffle with whole shards at the first latency only)",
                        "columns": ["latency", "pipe", "frames", "local frames/s", "s3 frames/s", "ratio",
                                    "bytes / own", "GETs", "episodes / batch",
                                    "client CPU ms/frame (local / s3)", "server CPU s per s3 pass"],
                        "rows": table}, opened["table"]]}


if __name__ == "__main__":
    import json
    import tempfile

    sys.path.insert(0, str(ROOT))
    with tempfile.TemporaryDirectory() as d:
        if "--open" in sys.argv:
            print(json.dumps(open_costs(Path(d), "--quick" in sys.argv)["table"], indent=1))
        else:
            print(json.dumps(run(Path(d), "--quick" in sys.argv), indent=1))
