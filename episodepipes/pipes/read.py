"""`ShardReader`: the raw tar members of planned items, read by seeking where the source can seek.

Local shards are read one contiguous byte range (`Run`) at a time, so a pinned episode costs its own
bytes only; the index's frame offsets split a run into samples, each frame's bytes are checked
against the index's CRC32 (where it has one), and a small header parser (with webdataset's tar
iterator as fallback) splits a sample into members. Any other URL (``pipe:``, ``http://``...) is
streamed through webdataset's ``gopen``, ``tar_file_iterator`` and ``group_by_keys``, skipping
forward to the wanted samples and stopping after the last one. A streamed frame has no CRC check:
webdataset hands over member payloads, not the frame's tar bytes (headers included) the CRC covers.
"""

from __future__ import annotations

import io
import itertools
import os
import zlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any, BinaryIO

from torchdata.nodes import BaseNode
from webdataset.gopen import gopen
from webdataset.tariterators import group_by_keys, tar_file_iterator

from episodepipes.format import sample_key
from episodepipes.index import EpisodeIndex
from episodepipes.pipes.plan import Item, read_runs
from episodepipes.pipes.sample import RawSample
from episodepipes.pipes.stats import Stats
from episodepipes.tarmembers import frame_fields


def is_local(url: str) -> bool:
    return "://" not in url and not url.startswith("pipe:") or url.startswith("file://")


class ShardReader(BaseNode[RawSample]):
    """Yield a `RawSample` per planned item, in plan order.

    Args:
        index: the shard index.
        items: the plan (see `episodepipes.pipes.plan`).
        stats: counters to add ``bytes_read`` and ``frames_read`` to.
        url: maps a shard number to what webdataset's ``gopen`` opens; local paths by default.
    """

    POS_KEY = "pos"

    def __init__(self, index: EpisodeIndex, items: Sequence[Item], *, stats: Stats | None = None,
                 url: Callable[[int], str] | None = None) -> None:
        super().__init__()
        self.index, self.items, self.stats = index, items, stats if stats is not None else Stats()
        self.url = url or (lambda i: str(index.shard_path(i)))
        self._it: Iterator[RawSample] | None = None
        self._files: dict[int, BinaryIO] = {}
        self._pos = 0

    def reset(self, initial_state: dict | None = None) -> None:
        super().reset(initial_state)
        self.shutdown()
        self._pos = initial_state[self.POS_KEY] if initial_state else 0
        self._it = self._samples(self.items[self._pos:])

    def next(self) -> RawSample:
        assert self._it is not None  # reset() ran: BaseNode guarantees it
        raw = next(self._it)
        self._pos += 1
        return raw

    def get_state(self) -> dict[str, Any]:
        return {self.POS_KEY: self._pos}

    def shutdown(self) -> None:
        """Close open shard files and any stream (a ``pipe:`` subprocess, a socket); `reset` reopens them."""
        it, self._it = self._it, None
        if it is not None:
            it.close()  # runs the generator's `finally`, which closes a stream it holds
        self._close_files()

    close = shutdown  # the name callers used before torchdata's `shutdown`

    def _close_files(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()

    def _samples(self, items: Sequence[Item]) -> Iterator[RawSample]:
        runs = read_runs(self.index, items)
        for shard, group in itertools.groupby(runs, key=lambda r: r.shard):
            url = self.url(shard)
            if is_local(url):
                for run in group:
                    yield from self._read_local(run, url)
            else:  # one forward stream per consecutive use of a shard
                yield from self._read_stream([i for r in group for i in r.items], url)
        self._close_files()  # not close(): this generator is still running

    def _open(self, shard: int, url: str) -> BinaryIO:
        if shard not in self._files:
            path = url.removeprefix("file://")
            try:
                self._files[shard] = open(path, "rb")  # closed in close()
            except FileNotFoundError:
                raise FileNotFoundError(f"shard {path} is missing; restore it or re-shard {self.index.root}") from None
        return self._files[shard]

    def _read_local(self, run: Any, url: str) -> Iterator[RawSample]:
        f = self._open(run.shard, url)
        f.seek(run.start)
        data = f.read(run.end - run.start)
        self.stats.add("bytes_read", len(data))
        if len(data) != run.end - run.start:
            raise ValueError(f"shard {url} ends at byte {run.start + len(data)}, the index expects {run.end}: "
                             "truncated? re-shard it or check with verify=True")
        name = os.path.basename(url)

        def pread(size: int, offset: int) -> bytes:  # the run is in memory: frames are slices of it
            return data[offset - run.start:offset - run.start + size]

        view = memoryview(data)
        for k, item in enumerate(run.items):  # each frame's byte range is known: split, no grouping by name
            a, b = run.bounds[k], run.bounds[k + 1]
            want = self.index.episode(item.episode).frame_crc(item.frame)
            damaged = None
            if want is not None and zlib.crc32(view[a - run.start:b - run.start]) != want:
                damaged = "crc32 mismatch"
            try:
                members, _ = frame_fields(pread, a, b, item.episode, item.frame, where=f"shard {url}")
            except ValueError:
                if damaged is None:
                    raise
                members = {}  # the damage hit a tar header: the decoder fills the whole sample with zeros
            self.stats.add("frames_read")
            yield RawSample(item, name, members, damaged)

    def _read_stream(self, items: Sequence[Item], url: str) -> Iterator[RawSample]:
        stream = _Counting(gopen(url, "rb"), self.stats)
        try:
            yield from self._group(items, tar_file_iterator(stream), url)
        finally:
            stream.close()

    def _group(self, items: Sequence[Item], members: Iterator[dict[str, Any]], url: str) -> Iterator[RawSample]:
        """Yield items in plan order from samples in file order, reading no further than the last wanted one."""
        wanted = {sample_key(i.episode, i.frame) for i in items}
        samples = group_by_keys(({**m, "__url__": url} for m in members), lcase=False)
        got: dict[str, dict[str, bytes]] = {}
        name = os.path.basename(url)
        for item in items:
            key = sample_key(item.episode, item.frame)
            while key not in got:
                s = next(samples, None)
                if s is None:
                    raise ValueError(f"shard {url} has no sample {key!r}: truncated or not this index's shard; "
                                     "re-shard it or check with verify=True")
                if s["__key__"] in wanted:
                    got[s["__key__"]] = {k: v for k, v in s.items() if not k.startswith("__")}
            self.stats.add("frames_read")
            yield RawSample(item, name, got[key])


class _Counting(io.RawIOBase):
    """A read-only stream wrapper that adds what it reads to ``stats["bytes_read"]``."""

    def __init__(self, raw: BinaryIO, stats: Stats) -> None:
        super().__init__()
        self.raw, self.stats = raw, stats

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n)
        self.stats.add("bytes_read", len(data))
        return data

    def readinto(self, b: Any) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self.raw.close()
        super().close()
