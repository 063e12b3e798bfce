"""A validation pass that renders nothing, against what a competent user writes to skip it.

The pinned val loader renders a video now and then; on every other pass it should cost nothing.
Five ways to get there, each built once and iterated pass after pass as Lightning does:

- (a) naive: ``DataLoader(map-style dataset, num_workers=2)`` whose ``validation_step`` returns early,
  so every frame is still read and decoded by the workers;
- (b) flag-gated ``IterableDataset`` (the flag, a shared ``multiprocessing.Value``, checked in
  ``__iter__``; a closed pass yields nothing) with ``num_workers=0``;
- (c) the same with 2 persistent workers (a closed pass still round-trips through both workers);
- (d) the same with 2 non-persistent workers (a closed pass starts and joins 2 worker processes);
- (e) episodepipes: `video_pipe` with ``gate=`` returning False (2 decode threads on an open pass).

Per closed pass: median and range of wall time over the repeats. Held between passes, i.e. during
training: live worker processes, their RSS and PSS (PSS splits forked copy-on-write pages between
the processes sharing them), the RSS of the whole process tree (this benchmark's own process, with
torch and the index loaded, included), and the threads the loader added to this process.

The throwaway ``iter()`` at setup: Lightning's ``_check_dataloader_iterable`` returns at once for a
``torch.utils.data.DataLoader`` instance and calls ``iter()`` only on other iterables, so it is
measured on a custom iterable wrapper around a ``DataLoader`` (as a user gating a loader writes it),
against episodepipes' `Pipe`, which Lightning also calls ``iter()`` on. A plain ``DataLoader`` pays nothing.
"""

from __future__ import annotations

import gc
import io
import multiprocessing as mp
import statistics
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import cv2
import numpy as np
import torch

from benchmarks.bench_decode import make_data
from benchmarks.procs import descendants, held
from episodepipes.pipes import EpisodeIndex, video_pipe

BATCH = 16


def _decode(index: EpisodeIndex, e: str, f: int, counter: object) -> dict:
    from webdataset.tariterators import tar_file_iterator

    shard, a, b = index.episode(e).frame_range(f)
    with open(index.shard_path(shard), "rb") as fh:
        fh.seek(a)
        blob = fh.read(b - a)
    out: dict = {"frame": f}
    for m in tar_file_iterator(io.BytesIO(blob)):
        if m["fname"].endswith(".jpg"):
            img = cv2.imdecode(np.frombuffer(m["data"], np.uint8), cv2.IMREAD_COLOR)
            out[m["fname"].split(".")[-2]] = torch.from_numpy(img[:, :, ::-1].transpose(2, 0, 1).copy())
            with counter.get_lock():  # type: ignore[attr-defined]
                counter.value += 1  # type: ignore[attr-defined]
    return out


class PinnedFrames(torch.utils.data.Dataset):
    """(a) What a user writes without a gate: seek to each frame's bytes, decode every camera."""

    def __init__(self, index: EpisodeIndex, episodes: list[str], counter: object) -> None:
        self.items = [(e, f) for e in episodes for f in range(index.episode(e).length)]
        self.index, self.counter = index, counter

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict:
        return _decode(self.index, *self.items[i], self.counter)


class FlagGated(torch.utils.data.IterableDataset):
    """(b-d) The same frames behind a flag checked in ``__iter__``: a closed pass yields nothing.

    The flag is a shared ``multiprocessing.Value`` so that persistent workers, which hold their own
    copy of the dataset, see it flip.
    """

    def __init__(self, index: EpisodeIndex, episodes: list[str], counter: object, render: object) -> None:
        self.items = [(e, f) for e in episodes for f in range(index.episode(e).length)]
        self.index, self.counter, self.render = index, counter, render

    def __iter__(self) -> Iterator[dict]:
        if not self.render.value:  # type: ignore[attr-defined]
            return
        info = torch.utils.data.get_worker_info()
        k, n = (info.id, info.num_workers) if info is not None else (0, 1)
        for e, f in self.items[k::n]:
            yield _decode(self.index, e, f, self.counter)


class IterableWrapper:
    """A custom iterable around a ``DataLoader``: not a ``DataLoader``, so Lightning calls ``iter()`` on it."""

    def __init__(self, loader: torch.utils.data.DataLoader) -> None:
        self.loader = loader

    def __iter__(self) -> Iterator:
        return iter(self.loader)

    def __len__(self) -> int:
        return len(self.loader)


def _validation_step(batch: object, render: bool) -> None:
    if not render:
        return  # the early return: the batch was already built


def _passes(loader: Iterable, n: int) -> list[float]:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        for b in loader:
            _validation_step(b, render=False)
        times.append(time.perf_counter() - t0)
    return times


def _throwaway(make: Callable[[], Iterable], counter: object) -> tuple[float, int]:
    """ms spent in ``iter()`` and dropping it (not the 0.5 s of other setup between), frames decoded meanwhile."""
    loader = make()
    counter.value = 0  # type: ignore[attr-defined]
    gc.collect()  # earlier garbage is not this loader's cost
    t0 = time.perf_counter()
    it = iter(loader)
    t1 = time.perf_counter()
    time.sleep(0.5)  # the trainer does other setup while any workers prefetch
    t2 = time.perf_counter()
    del it  # a non-persistent DataLoader iterator joins its workers here
    t3 = time.perf_counter()
    return ((t1 - t0) + (t3 - t2)) * 1e3, int(counter.value)  # type: ignore[attr-defined]


def run(workdir: Path, quick: bool) -> dict:
    index = make_data(workdir, quick)
    pinned = [index.episodes[0].id, index.episodes[1].id]
    frames = sum(index.episode(e).length for e in pinned)
    cams = len(index.episodes[0].cameras)
    ctx = mp.get_context("fork")
    counter, render = ctx.Value("l", 0), ctx.Value("b", 0)
    slow, fast = (3, 200) if quick else (7, 1000)

    def gated(workers: int, persistent: bool) -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(FlagGated(index, pinned, counter, render), batch_size=BATCH,
                                           num_workers=workers, persistent_workers=persistent,
                                           multiprocessing_context=ctx if workers else None)

    loaders: list[tuple[str, Callable[[], Iterable], int]] = [
        ("(a) naive DataLoader, 2 workers, step returns early",
         lambda: torch.utils.data.DataLoader(PinnedFrames(index, pinned, counter), batch_size=BATCH, num_workers=2,
                                             multiprocessing_context=ctx), slow),
        ("(b) flag-gated IterableDataset, num_workers=0", lambda: gated(0, False), fast),
        ("(c) flag-gated IterableDataset, 2 persistent workers", lambda: gated(2, True), fast // 5),
        ("(d) flag-gated IterableDataset, 2 non-persistent workers", lambda: gated(2, False), max(slow, 10)),
        ("(e) episodepipes video_pipe, gate closed",
         lambda: video_pipe(index, episodes=pinned, batch_size=BATCH, max_batches=-(-frames // BATCH),
                            gate=lambda: bool(render.value)), fast),
    ]
    table, series = [], {}
    render.value = 0
    for name, make, n in loaders:
        there = set(descendants())  # what earlier sections left (a fork server of a process pass) is not this loader's
        before = held(exclude=there)
        loader = make()
        _passes(loader, 1)  # warm-up: persistent workers start on the first pass
        counter.value = 0
        times = _passes(loader, n)
        decoded = counter.value / n
        h = held(exclude=there)
        stats = getattr(loader, "stats", None)
        if stats is not None:  # ours counts its own decodes (threads, not the shared counter)
            decoded = stats["frames_decoded"] / (n + 1)
        ms = [t * 1e3 for t in times]
        med = statistics.median(ms)
        table.append([name, f"{med:.4g}", f"{min(ms):.4g}-{max(ms):.4g}", str(n), f"{decoded:g}",
                      str(h["processes"]), f"{h['children_rss_mb']:.0f}", f"{h['children_pss_mb']:.0f}",
                      f"{h['tree_rss_mb']:.0f}",
                      f"{max(0, h['threads'] - before['threads'])}"])  # others' threads may end meanwhile
        series[name] = {"median_ms": med, "min_ms": min(ms), "max_ms": max(ms), "reps": n, "decoded": decoded, **h}
        del loader
        gc.collect()
        time.sleep(0.2)  # let dropped workers exit before the next loader is measured

    # the open pass, for scale: what a render costs when the gate opens
    render.value = 1
    ours = loaders[-1][1]()
    persistent = gated(2, True)
    _passes(ours, 1)
    _passes(persistent, 1)
    open_ours, open_gated = statistics.median(_passes(ours, 3)), statistics.median(_passes(persistent, 3))
    del persistent
    gc.collect()
    render.value = 0

    throw = [("custom iterable wrapper around (a)", lambda: IterableWrapper(loaders[0][1]())),
             ("custom iterable wrapper around (d)", lambda: IterableWrapper(gated(2, False))),
             ("custom iterable wrapper around (c)", lambda: IterableWrapper(gated(2, True))),
             ("episodepipes Pipe (e)", loaders[-1][1])]
    throw_rows = []
    for name, make in throw:
        ms, dec = _throwaway(make, counter)
        throw_rows.append([name, f"{ms:.4g}", str(dec)])
        series[f"throwaway: {name}"] = {"ms": ms, "decoded": dec}
        gc.collect()

    rows = []  # absolute costs are in the table above; a ratio over a microsecond denominator says little
    rows.append({"metric": "open (render) pass, vs (c) opened", "ours": open_ours * 1e3, "baseline": open_gated * 1e3,
                 "ceiling": None, "unit": "ms", "note": f"{frames} frames x {cams} cameras decoded; for scale"})
    return {"section": "gate", "intro": __doc__.split("\n\n", 1)[1].strip() + f"\n\n{frames} pinned frames x {cams} "
            f"cameras ({index.episodes[0].cameras['front'].height}x{index.episodes[0].cameras['front'].width}), "
            f"batch {BATCH}.",
            "tables": [
                {"title": "Per closed pass, and what each holds between passes",
                 "columns": ["loader", "closed pass median (ms)", "range (ms)", "passes", "frames decoded per pass",
                             "worker processes held", "workers' RSS (MB)", "workers' PSS (MB)",
                             "process tree RSS (MB)", "threads held"],
                 "rows": table},
                {"title": "Throwaway iter() at setup (Lightning calls it on non-DataLoader iterables only)",
                 "columns": ["loader", "iter() + drop (ms)", "frames decoded in the 0.5 s after iter()"],
                 "rows": throw_rows}],
            "rows": rows, "series": series}
