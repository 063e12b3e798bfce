"""The encoder processes of `write_shards`: one task reads and encodes one episode.

Results come back in task order (an ordered ``imap``), so the output never depends on timing or
on the number of workers.
"""

from __future__ import annotations

import contextlib
import itertools
import mmap
import multiprocessing as mp
import os
from collections.abc import Iterator
from pathlib import Path

import cv2

from episodepipes.sharding.encode import encode_episode
from episodepipes.sharding.episode import EpisodeError


def _encode(task: tuple) -> tuple:
    """Worker: read and encode one episode. Input errors come back as values, to be skipped or raised.

    With a ``spool`` folder the samples go to a file there and only its name and the sample sizes
    return: pickling megabytes through the pool's pipe cost the parent more CPU than hashing and
    writing them, and the parent is the one process that cannot be parallelised.
    """
    reader, eid, split, opts, spool = task
    try:
        ep = reader.read(eid)
        if split is not None:
            ep.split = split
        if ep.split not in (None, "train", "val"):
            raise EpisodeError(f"episode {eid!r}: split {ep.split!r} is not 'train' or 'val'; fix its metadata "
                               "or pass --val-fraction/--val-episodes")
        enc = encode_episode(ep, opts)
        blocks = enc.blocks()
        if spool is None:
            return "ok", enc.meta, blocks
        path = Path(spool) / f"{enc.meta['id']}.samples"
        with open(path, "wb") as f:
            f.writelines(blocks)
        return "ok", enc.meta, (str(path), [len(b) for b in blocks])
    except (EpisodeError, ValueError, OSError, cv2.error) as e:
        msg = str(e) if isinstance(e, EpisodeError) else f"episode {eid!r}: {type(e).__name__}: {e}"
        return "bad", eid, msg


@contextlib.contextmanager
def samples(payload: list[bytes] | tuple[str, list[int]]) -> Iterator[list]:
    """The sample blocks of a worker result: as sent, or memory-mapped (no copy) from its spool file."""
    if isinstance(payload, list):
        yield payload
        return
    path, sizes = payload
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        whole = memoryview(mm)
        bounds = list(itertools.accumulate(sizes, initial=0))
        views = [whole[a:b] for a, b in zip(bounds, bounds[1:])]
        try:
            yield views
        finally:
            for v in views:
                v.release()
            whole.release()
    os.unlink(path)


def _init_worker() -> None:
    cv2.setNumThreads(1)  # one process per core already; cv2's own threads would only contend


def encoded(tasks: list[tuple], workers: int) -> Iterator[tuple]:
    """`_encode` over ``tasks`` in order: in this process, or in ``workers`` forked processes."""
    if workers <= 1:
        yield from map(_encode, tasks)
        return
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    with ctx.Pool(workers, initializer=_init_worker) as pool:
        yield from pool.imap(_encode, tasks, chunksize=1)
