"""Executor probe: the Decoder's own in-order executor (`InOrder`) against torchdata's `ParallelMapper`.

`PMDecoder` is the `Decoder` with its executor replaced by `ParallelMapper` (``prebatch`` for processes whose
frames come back pickled): the same `SampleDecode`, frame sinks and reporting; the mapper is reset at the
first ``next()`` so workers still start there. It is a measuring device, not a node to use: it keeps no
resume state and stops the mapper through torchdata's private ``_shutdown``.

    PYTHONPATH=. python benchmarks/executor_probe.py WORKDIR [REPS]

prints, per row of the decode and train quick benchmarks, the median ratio of ParallelMapper to ours over
REPS alternated passes, then each executor's first-batch and shutdown time and what is left running.
"""

from __future__ import annotations

import json
import multiprocessing
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

from torchdata.nodes import BaseNode, ParallelMapper

import episodepipes.pipes.builders as builders_mod
import episodepipes.pipes.train as train_mod
from benchmarks import bench_decode as bd
from benchmarks import bench_train as bt
from episodepipes import _forkserver
from episodepipes.pipes import BatchStacker, ShardReader
from episodepipes.pipes._decode import pool as _pool
from episodepipes.pipes._decode.lifecycle import shutdown_node
from episodepipes.pipes._decode.sinks import decode_into
from episodepipes.pipes.decode import Decoder
from episodepipes.pipes.plan import Item

_INIT = [False]


class _Task:
    def __init__(self, fn: Any, method: str) -> None:
        self.fn, self.method = fn, method

    def __call__(self, x: Any) -> Any:
        if self.method == "process" and not _INIT[0]:
            _pool._init_process()
            _INIT[0] = True
        raw, spec, claim = x
        return raw, claim, decode_into(self.fn, raw, spec, claim.ticket)


class _Claimed(BaseNode):
    """Runs in the mapper's reading thread: assigns each sample its frame rows in order."""

    def __init__(self, dec: Any) -> None:
        super().__init__()
        self.dec = dec

    def reset(self, initial_state: dict | None = None) -> None:
        super().reset(initial_state)
        self.dec.source.reset(initial_state)

    def next(self) -> Any:
        raw = next(self.dec.source)
        spec = self.dec._spec(raw.item.episode)
        shapes = self.dec._shapes(spec)
        if not self.dec._started:
            self.dec._sink.start(shapes, self.dec.prefetch)
            self.dec._started = True
        return raw, spec, self.dec._sink.claim(shapes)

    def get_state(self) -> dict:
        return self.dec.source.state_dict()


class PMDecoder(Decoder):
    """`Decoder` over `ParallelMapper` (see the module docstring); same constructor."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        o = self.options
        pickled = o.method == "process" and self.chunk > 1
        self._started = False
        start = _forkserver.start_method() if o.method == "process" else None
        self._mapper = ParallelMapper(_Claimed(self), _Task(self.fn, o.method), o.num_workers, method=o.method,
                                      multiprocessing_context=start,
                                      prebatch=self.chunk if pickled else None)
        self._live = False

    def reset(self, initial_state: dict | None = None) -> None:
        BaseNode.reset(self, initial_state)
        self._state = initial_state
        self._live = False
        self._corrupt = 0

    def next(self) -> dict:
        if not self._live:
            # the shared ring must exist before the mapper forks its workers: made from the first episode's shapes
            if self.options.method == "process" and not self._started:
                self._sink.start(self._shapes(self._spec(self.index.episodes[0].id)), self.prefetch)
                self._started = True
            self._mapper.reset(None)
            self._live = True
        try:
            raw, claim, decoded = next(self._mapper)
        except StopIteration:
            self.shutdown()
            raise
        if claim.shared:
            decoded.fields.update(claim.rows)
        return self._report(raw, decoded)

    def get_state(self) -> dict:
        return {}

    def shutdown(self) -> None:
        if self._live:
            impl = self._mapper._it
            if type(impl).__name__ == "Unbatcher":  # prebatch wraps it
                impl = impl.source
            if impl._it is not None:
                impl._it._shutdown()
            self._live = False
            self._sink.end()
            self._started = False
        shutdown_node(self.source)


def with_decoder(cls: type, make: Any) -> Any:
    builders_mod.Decoder = train_mod.Decoder = cls
    try:
        return make()
    finally:
        builders_mod.Decoder = train_mod.Decoder = Decoder


def rate(one: Any) -> float:
    t0 = time.perf_counter()
    n = one()
    return n / (time.perf_counter() - t0)


def compare(make: Any, reps: int) -> dict:
    ours, pm = with_decoder(Decoder, make), with_decoder(PMDecoder, make)
    ours(), pm()  # warm-up
    pairs = [(rate(ours), rate(pm)) for _ in range(reps)]
    ratios = sorted(p / o for o, p in pairs)
    return {"ours": round(statistics.median(o for o, _ in pairs)), "pm": round(statistics.median(p for _, p in pairs)),
            "pm/ours median": round(statistics.median(ratios), 3), "range": [round(ratios[0], 3), round(ratios[-1], 3)]}



def lifecycle(index: Any) -> list[str]:
    """First-batch and shutdown time of each executor, and the threads and processes left after shutdown."""
    items = [Item(e.id, f) for e in index.episodes for f in range(e.length)]
    lines = []
    for cls in (Decoder, PMDecoder):
        for m in ("thread", "process"):
            before = set(threading.enumerate())
            d = cls(ShardReader(index, items), index, method=m, slab=16)
            c = BatchStacker(d, batch_size=16, rows=d)
            c.reset()
            t0 = time.perf_counter()
            next(c)
            t1 = time.perf_counter()
            c.shutdown()
            t2 = time.perf_counter()
            time.sleep(0.05)
            left = (len(set(threading.enumerate()) - before), len(multiprocessing.active_children()))
            lines.append(f"{cls.__name__} {m}: first batch {t1 - t0:.3f} s, shutdown {t2 - t1:.3f} s, "
                         f"left {left[0]} threads, {left[1]} processes")
    return lines


def main(work: Path, reps: int) -> None:
    index = bd.make_data(work, True)
    out = {}
    for m in ("thread", "process"):
        def make(m: str = m) -> Any:
            pipe = bd.video_pipe(index, episodes=[e.id for e in index.episodes], batch_size=bd.BATCH,
                                 max_batches=10**6, num_workers=2, method=m)

            def one() -> int:
                before = pipe.stats["frames_decoded"]
                for _ in pipe:
                    pass
                return pipe.stats["frames_decoded"] - before
            return one
        out[f"decode {m}"] = compare(make, reps)
    idx = bt.make_data(work / "train-probe", episodes=8, length=60)
    for name, kw in (("thread", {}), ("process", {"method": "process"}),
                     ("windows", {"history": {"state": 2, "front": 2}, "horizon": {"action": 16}})):
        def make(kw: dict = kw) -> Any:
            pipe = bt.train_pipe(idx, batch_size=bt.BATCH, seed=0, rank=0, world_size=1, num_workers=2, **kw)
            return lambda: bt._count(pipe)
        out[f"train {name}"] = compare(make, reps)
    print(json.dumps(out, indent=1))
    print("\n".join(lifecycle(index)))


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 5)
