"""`ShardReader`: the raw tar members of planned items, read through the dataset's byte source.

Shards are read one contiguous byte range (`Run`) at a time, so a pinned episode costs its own
bytes only; the index's frame offsets split a run into samples, each frame's bytes are checked
against the index's CRC32 (where it has one), and `episodepipes.tarmembers` parses the tar headers
of a sample's byte range into its members. The runs of a shard go to the source's `read_ranges` in
bounded batches, so a remote root (``s3://``...) fetches them as coalesced, concurrent ranged GETs,
in this process (never in a decode worker).

Packed shards (video cameras, `episodepipes.codec.chunk`): a run starts at its first frame's key frame (`from_keys`),
so a sparse frame reads its GOP's records up to itself and nothing else, and each record is CRC-checked and parsed
into the members a frame of the members layout has (`videoframes.packed_members`).

History/horizon windows (``windows=``): the steps the items' windows show are read with them, each once while
needed (`order.window.window_reads`), and each item comes as the window sample `train_pipe`'s reader makes
(`order.window.window_samples`), for the same `SampleDecode`.
"""

from __future__ import annotations

import functools
import itertools
import os
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from torchdata.nodes import BaseNode

from episodepipes.format import sample_key
from episodepipes.index import EpisodeIndex
from episodepipes.pipes._decode.mapped import ShardFrames, ShardSlice, frame_members
from episodepipes.pipes._saved import saved_position
from episodepipes.pipes.order.window import Window, window_reads, window_samples
from episodepipes.pipes.plan import Item, Run, iter_runs
from episodepipes.pipes.sample import RawSample
from episodepipes.pipes.stats import Stats
from episodepipes.pipes.videoframes import attach_gop, checked, key_frame, packed_members, parse_packed, video_cameras
from episodepipes.remote.ahead import ReadAhead
from episodepipes.shardio import ByteSource, LocalSource, open_source
from episodepipes.tarmembers import frame_fields


class ShardReader(BaseNode[RawSample]):
    """Yield a `RawSample` per planned item, in plan order.

    Args:
        index: the shard index.
        items: the plan (see `episodepipes.pipes.plan`).
        stats: counters to add ``bytes_read`` and ``frames_read`` to.
        source: the byte source the shards are read from; by default the index folder's, which the
            reader opens and closes itself (a source passed in is the caller's to close).
        windows: history/horizon windows by key (`order.window.plan_windows`): each item then comes as a window
            sample, its windows' steps read with it; None or empty: each item's own members.
    """

    POS_KEY = "pos"
    BATCH_BYTES = 32 << 20  # runs of one shard handed to read_ranges at once (a remote source overlaps their GETs)
    READ_AHEAD = 2  # calls a remote root's reader fetches ahead of the one it yields
    PIECE = 4 << 20  # bytes of a local run's whole frames read per call (`_read_mapped`)

    def __init__(self, index: EpisodeIndex, items: Sequence[Item], *, stats: Stats | None = None,
                 source: ByteSource | None = None, windows: Mapping[str, Window] | None = None) -> None:
        super().__init__()
        self.index, self.items, self.stats = index, items, stats if stats is not None else Stats()
        self.windows = dict(windows or {})
        if source is None and index.remote:
            source = index.source  # the index's own: kept open across passes, for its connections
        self._own = source is None
        self.source = source if source is not None else open_source(index.root)
        self._it: Iterator[RawSample] | None = None
        self._mapped: ShardFrames | None = None  # a local root's frame reads, for this pass (`_local_members`)
        self._slices = False  # frames as ShardSlice references, for decode processes (`send_slices`)
        self._pos = 0

    def reset(self, initial_state: dict | None = None) -> None:
        super().reset(initial_state)
        self.shutdown()
        self._pos = saved_position(initial_state[self.POS_KEY], end=len(self.items)) if initial_state else 0
        self._it = self._samples(self.items[self._pos:])

    def next(self) -> RawSample:
        assert self._it is not None  # reset() ran: BaseNode guarantees it
        raw = next(self._it)
        self._pos += 1
        return raw

    def get_state(self) -> dict[str, Any]:
        return {self.POS_KEY: self._pos}

    def send_slices(self) -> None:
        """Hand frames of local shards out as `ShardSlice` references, which a decode process resolves against a
        read of its own (`Decoder` asks this of its source for ``method="process"``, `links.SendSlices`): no frame
        bytes are copied or pickled. Frames read otherwise (remote, packed, video cameras, windows, a frame the fast
        path does not parse) still come as bytes."""
        self._slices = True

    def shutdown(self) -> None:
        """Close open shard files; `reset` reopens them."""
        it, self._it = self._it, None
        if it is not None:
            it.close()
        self._close_files()

    close = shutdown  # the name callers used before torchdata's `shutdown`

    def _close_files(self) -> None:
        self._mapped = None
        if self._own:
            self.source.close()

    def _samples(self, items: Sequence[Item]) -> Iterator[RawSample]:
        return self._read_items(items) if not self.windows else self._windowed(items)

    def _windowed(self, items: Sequence[Item]) -> Iterator[RawSample]:
        """The window samples of ``items``: their windows' steps read in plan order, each once while needed."""
        lengths = {e: self.index.episode(e).length for e in {it.episode for it in items}}
        plan = window_reads(items, lengths, self.windows)
        raws = self._read_items(plan.reads)
        try:
            yield from window_samples(items, plan, raws, lengths, self.windows)
        finally:
            raws.close()  # its read-ahead and files, when a pass ends early

    def _read_items(self, items: Sequence[Item]) -> Iterator[RawSample]:
        calls = _Planned(self._calls(items))  # planned as the reads get there: the first costs its chunk only
        ahead = None
        if self.index.remote:  # the plan is known: the next calls' GETs go out while this one's frames decode
            ahead = ReadAhead(lambda k: self.source.read_ranges(calls[k][0], _spans(calls[k][1])),
                              lambda k: k + 1 if calls.has(k + 1) else None, depth=self.READ_AHEAD)
        read = self._read_packed if self._packed else self._read_run
        mapped = self._local_members()
        try:
            for k, (name, runs) in enumerate(calls):
                if mapped is not None:
                    for r in runs:
                        yield from self._read_mapped(r, mapped, name)
                    continue
                datas = ahead.get(k) if ahead is not None else self.source.read_ranges(name, _spans(runs))
                for r, data in zip(runs, datas):
                    yield from read(r, self.source, name, data)
        finally:
            if ahead is not None:
                ahead.close()
        self._close_files()  # not close(): this generator is still running

    def _calls(self, items: Sequence[Item]) -> Iterator[tuple[str, list[Run]]]:
        """The plan's runs as `read_ranges` calls: one shard's runs, ``BATCH_BYTES`` of them per call.

        A remote source fetches a call's ranges together (coalesced, in flight at once), so per-request
        latency is paid once per call rather than once per run; the bound keeps a long pass's memory bounded.
        """
        runs: Iterable[Run] = iter_runs(self.index, items)
        if self._packed:
            runs = from_keys(self.index, runs)
        for shard, group in itertools.groupby(runs, key=lambda r: r.shard):
            name, batch, size = self.index.shards[shard].name, [], 0
            for run in group:
                batch.append(run)
                size += run.end - run.start
                if size >= self.BATCH_BYTES:
                    yield name, batch
                    batch, size = [], 0
            if batch:
                yield name, batch

    @functools.cached_property
    def _video(self) -> bool:
        return bool(video_cameras(self.index))

    @functools.cached_property
    def _packed(self) -> bool:
        return self.index.meta.get("layout") == "packed"

    def _earlier(self, seen: dict, episode: str, frame: int, source: ByteSource, name: str,
                 shard: int) -> dict[str, bytes] | None:
        """An earlier frame of a GOP: from this run, or read (and CRC-checked) from its shard; None if damaged."""
        got = seen.get((episode, frame))
        if got is not None:
            return got
        at, a, b = self.index.episode(episode).frame_range(frame)
        if at != shard:
            source, name = self.source, self.index.shards[at].name
        data = source.read(name, a, b - a)
        self.stats.add("bytes_read", len(data))
        if not checked(self.index, episode, frame, data):
            return None
        try:
            got, _ = frame_fields(lambda size, off: data[off - a:off - a + size], a, b, episode, frame, where=name)
        except ValueError:
            return None
        seen[episode, frame] = got
        return got

    def _local_members(self) -> ShardFrames | None:
        """The frame reads of a local root's shards of the members layout with JPEG cameras only (the fast path of
        `_read_mapped`), made once per pass; None for anything else: remote, packed, video cameras (whose GOPs
        need each earlier frame's CRC32 checked here before a later frame takes its packets), or a source passed
        in (the caller's: read through its ``read_ranges``)."""
        if self.index.remote or self._packed or self._video or not self._own or not isinstance(self.source,
                                                                                               LocalSource):
            return None
        if self._mapped is None:
            self._mapped = ShardFrames(self.source)
        return self._mapped

    def _read_mapped(self, run: Run, frames: ShardFrames, name: str) -> Iterator[RawSample]:
        """The samples of one run of a local shard, read ``PIECE`` bytes of whole frames per ``pread`` (a file cut
        short under the pass is the source's error naming it, never a fault): members are slices of those bytes
        whose tar headers `frame_members` parsed in place, with the frame's CRC32 left to the decode thread
        (`RawSample.checks`; for processes `decode.portable` checks it here and copies the members to bytes); a
        frame it does not parse goes through `_read_run`, whose checks name what is wrong."""
        bounds, n, k = run.bounds, len(run.items), 0
        # window samples are checked here, before the batch's frames are shared out (`window_samples`): bytes then
        slices, path = self._slices and not self.windows, os.path.join(str(self.source.root), name)
        while k < n:
            j = k + 1
            while j < n and bounds[j + 1] - bounds[k] <= self.PIECE:
                j += 1
            first = bounds[k]
            piece = frames.frame(name, first, bounds[j])
            for i in range(k, j):
                item, a, b = run.items[i], bounds[i], bounds[i + 1]
                view = piece[a - first:b - first]
                got = frame_members(view, sample_key(item.episode, item.frame).encode() + b".")
                if got is None or not got[0]:
                    yield from self._read_run(Run(run.shard, a, b, (item,), (a, b), run.crcs[i:i + 1]), frames,
                                              name, view)
                    continue
                spans, size = got
                self.stats.add("bytes_read", size)
                self.stats.add("frames_read")
                crc = run.crcs[i] if run.crcs else self.index.episode(item.episode).frame_crc(item.frame)
                whole: memoryview | ShardSlice = view
                if slices:  # the worker reads them: members and the whole frame (its crc32) as references
                    members: dict[str, Any] = {f: ShardSlice(path, a + s, e - s) for f, (s, e) in spans.items()}
                    whole = ShardSlice(path, a, b - a)
                else:
                    members = {f: view[s:e] for f, (s, e) in spans.items()}  # type: ignore[index]
                yield RawSample(item, name, members, checks=() if crc is None else ((item.frame, whole, crc),))
            k = j

    def _read_run(self, run: Run, source: ByteSource | ShardFrames, name: str,
                  data: bytes | memoryview | None = None) -> Iterator[RawSample]:
        """The samples of one run, from its bytes (``data``, read here if not given)."""
        if data is None:
            data = source.read(name, run.start, run.end - run.start)
        self.stats.add("bytes_read", len(data))
        where = f"shard {os.path.join(str(self.source.root), name)}"

        def pread(size: int, offset: int) -> bytes:  # the run is in memory: frames are slices of it (bytes)
            return bytes(data[offset - run.start:offset - run.start + size])

        view = memoryview(data)
        seen: dict[tuple[str, int], dict[str, bytes]] = {}  # this run's frames, for video cameras' GOPs
        video = self._video
        for k, item in enumerate(run.items):  # each frame's byte range is known: split, no grouping by name
            a, b = run.bounds[k], run.bounds[k + 1]
            want = run.crcs[k] if run.crcs else self.index.episode(item.episode).frame_crc(item.frame)
            damaged = None
            if want is not None and zlib.crc32(view[a - run.start:b - run.start]) != want:
                damaged = "crc32 mismatch"
            try:
                members, _ = frame_fields(pread, a, b, item.episode, item.frame, where=where)
            except ValueError:
                if damaged is None:
                    raise
                members = {}  # the damage hit a tar header: the decoder fills the whole sample with zeros
            if video and damaged is None:
                if len(seen) > 256:  # a GOP's frames are the last few: an earlier one missing is read again
                    seen.clear()
                seen[item.episode, item.frame] = dict(members)
                damaged = attach_gop(self.index, item.episode, item.frame, members,
                                     lambda f, e=item.episode: self._earlier(seen, e, f, source, name, run.shard))
            self.stats.add("frames_read")
            yield RawSample(item, name, members, damaged)

    def _read_packed(self, run: Run, source: ByteSource, name: str, data: bytes) -> Iterator[RawSample]:
        """The samples of one run of packed records (`from_keys` started it at its first GOP's key frame)."""
        self.stats.add("bytes_read", len(data))
        view, ix = memoryview(data), self.index
        records: dict[tuple[str, int], Any] = {}

        def record(episode: str, frame: int) -> Any:
            got = records.get((episode, frame), records)
            if got is not records:
                return got
            shard, a, b = ix.episode(episode).frame_range(frame)
            if shard == run.shard and run.start <= a and b <= run.end:
                raw: bytes | memoryview = view[a - run.start:b - run.start]
            else:  # an earlier frame outside the run (its GOP's key frame is in another one): read it
                raw = (source if shard == run.shard else self.source).read(ix.shards[shard].name, a, b - a)
                self.stats.add("bytes_read", len(raw))
            records[episode, frame] = got = parse_packed(ix, episode, frame, raw)
            return got

        for item in run.items:
            members, damaged = packed_members(ix, item.episode, item.frame,
                                              lambda f, e=item.episode: record(e, f))
            self.stats.add("frames_read")
            yield RawSample(item, name, members, damaged)


def from_keys(index: EpisodeIndex, runs: Iterable[Run]) -> Iterator[Run]:
    """Packed layout: each run started at its first frame's key frame (the record its decode starts at), and runs
    that then touch or overlap merged, so a metric frame reads from its GOP's key frame to itself, once."""
    prev: Run | None = None
    for r in runs:
        first = r.items[0]
        key = key_frame(index, first.episode, first.frame)
        start = index.episode(first.episode).frame_range(key)[1] if key < first.frame else r.start
        if prev is not None and prev.shard == r.shard and start <= prev.end and r.end >= prev.end:
            prev = Run(r.shard, min(prev.start, start), r.end, prev.items + r.items)
            continue
        if prev is not None:
            yield prev
        prev = Run(r.shard, start, r.end, r.items)
    if prev is not None:
        yield prev


class _Planned(Sequence[tuple[str, list[Run]]]):
    """The reader's `read_ranges` calls, taken from their generator as they are asked for (by the pass, and by a
    remote root's read-ahead, which asks in this thread whether a next one exists before its threads read it);
    calls more than `KEEP` behind the last asked for are dropped, so a pass holds a few calls, not its plan."""

    KEEP = 8

    def __init__(self, calls: Iterator[tuple[str, list[Run]]]) -> None:
        self._gen: Iterator[tuple[str, list[Run]]] | None = calls
        self._got: dict[int, tuple[str, list[Run]]] = {}
        self._n = 0  # calls taken from the generator

    def has(self, k: int) -> bool:
        """Whether call ``k`` exists (planned up to it)."""
        while self._n <= k and self._gen is not None:
            nxt = next(self._gen, None)
            if nxt is None:
                self._gen = None
            else:
                self._got[self._n] = nxt
                self._n += 1
        for old in [j for j in self._got if j < k - self.KEEP]:
            del self._got[old]
        return k < self._n

    def __getitem__(self, k: int) -> tuple[str, list[Run]]:  # type: ignore[override]
        if not self.has(k) or k not in self._got:
            raise IndexError(f"call {k} is past the plan, or behind it by more than {self.KEEP}")
        return self._got[k]

    def __len__(self) -> int:  # the whole plan: asked by nothing on a pass's way
        self.has(1 << 62)
        return self._n

    def __iter__(self) -> Iterator[tuple[str, list[Run]]]:
        k = 0
        while self.has(k):
            yield self._got[k]
            k += 1


def _spans(runs: list[Run]) -> list[tuple[int, int]]:
    return [(r.start, r.end - r.start) for r in runs]
