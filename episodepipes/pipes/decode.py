"""`Decoder`: `RawSample`s to decoded sample dicts, in order, on a pool of threads or processes.

Made of parts: the pure per-sample function (`SampleDecode`, with its `FrameDecoder`), an in-order
executor (`InOrder`) and a frame sink (`Allocate`, `BatchRows`, `SharedRing`). The node itself reads
the source, wires them together, keeps the resume state and reports corrupt data.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
from torchdata.nodes import BaseNode

from episodepipes.index import EpisodeIndex
from episodepipes.pipes._decode import pool as _pool
from episodepipes.pipes._decode.batchmemo import BatchMemo
from episodepipes.pipes._decode.executor import InOrder
from episodepipes.pipes._decode.lifecycle import shutdown_node
from episodepipes.pipes._decode.mapped import ShardSlice, Wire, to_wire
from episodepipes.pipes._decode.sinks import Allocate, BatchRows, Claim, FrameSink, SharedRing, decode_into
from episodepipes.pipes._decode.slabs import Shapes, Slabs
from episodepipes.pipes.frames import JPEG, FrameDecoder
from episodepipes.pipes.links import Cursor, SendSlices
from episodepipes.pipes.options import DecodeOptions
from episodepipes.pipes.sample import RawSample, crc_mismatch
from episodepipes.pipes.sample_decode import Decoded, EpisodeSpec, SampleDecode
from episodepipes.pipes.stats import Stats
from episodepipes.pipes.videoframes import GopKeys

log = logging.getLogger(__name__)
CHUNK = 8  # samples per task by default (see `Decoder`'s ``chunk``)


class _InFlight(NamedTuple):
    before: Any  # the source's state before this sample (where a resume starts), or its `Cursor` (`_state`)
    raw: RawSample
    claim: Claim


class Decoder(BaseNode[dict]):
    """Decode `RawSample`s in order with up to ``prefetch`` in flight; the workers live for one pass and
    start at its first ``next()``.

    Args:
        source: the node yielding `RawSample`s (a `ShardReader`, or train_pipe's reader).
        index: the `EpisodeIndex` the samples come from.
        options: `DecodeOptions` (workers, method, resize, corrupt-data policy); the defaults when None.
        transform: ``sample -> sample`` run per sample in the workers (see `SampleDecode`).
        frames: the `FrameDecoder` of camera members (JPEG).
        prefetch: samples in flight; by default 4 per worker, or two chunks per worker where frames come
            back pickled.
        stats: counters to add to (``frames_decoded``, ``frames_corrupt``, ``workers_started``).
        slab: the batch size, to have workers decode into batch rows; a `Slabs` keeps those buffers across
            passes (a pipe gives one to every pass's decoder). Not used with a ``transform``.
        chunk: samples per task for processes whose frames come back pickled (a ``transform``, no
            ``slab``, or no fork server), and for every method when a `BatchStacker` asked for batch rows
            (`batch_rows`); every other case sends one sample per task.
        share_frames: once a `BatchStacker` asked for batch rows (`batch_rows`), decode a camera frame that
            several samples of a batch show (overlapping windows) once, and copy it into the others
            (`episodepipes.pipes._decode.batchmemo`); ``frames_decoded`` then counts distinct frames.
        cursor: ``source`` itself when it is a `links.Cursor` (a train reader): each sample in flight then keeps
            the source's cursor, not its state dict, which is made only when a state is asked for. None: the
            state dict, asked of the source before each sample.
        slices: the source's `links.SendSlices` (a train reader's ``send_slices``), called once here when the
            workers are processes, which then read the frames of local shards themselves. None: frames are sent.
        flat: `DecodeOptions` fields as keywords (``num_workers=2``, ``method="process"``...), replacing
            those of ``options``; each is checked where `DecodeOptions` defines it.

    Corrupt data (a JPEG that does not decode at the index's size, an .npy member that is not the index's
    dtype and shape, or a sample whose bytes fail the index's CRC32: ``RawSample.damaged``, every camera
    and array then) is replaced by zeros and the sample marked ``valid=False`` (so lengths stay exact),
    counted in ``stats["frames_corrupt"]`` and logged with its shard, episode, frame and cameras/arrays,
    or raised (``on_corrupt="raise"``). ``shutdown()`` ends a pass early; its state still resumes there.
    """

    SOURCE_KEY = "source"

    def __init__(self, source: BaseNode[RawSample], index: EpisodeIndex, options: DecodeOptions | None = None, *,
                 transform: Callable[[dict[str, Any]], dict[str, Any]] | None = None, frames: FrameDecoder = JPEG,
                 prefetch: int | None = None, stats: Stats | None = None, slab: int | Slabs = 0, chunk: int = CHUNK,
                 share_frames: bool = False, cursor: Cursor | None = None, slices: SendSlices | None = None,
                 **flat: Any) -> None:
        super().__init__()
        self.options = dataclasses.replace(options or DecodeOptions(), **flat)
        if chunk < 1:
            raise ValueError(f"chunk={chunk} should be >= 1")
        if cursor is not None and cursor is not source:
            raise ValueError("cursor= should be the source node itself (its cursor makes the source's state); "
                             "pass cursor=source, or None")
        self.source, self.index = source, index
        self.stats = stats if stats is not None else Stats()
        self.fn = SampleDecode(self.options.resize, frames, transform)
        self._asked = (prefetch, chunk)
        self._batched = False  # a BatchStacker takes every sample (batch_rows): chunk tasks for every method
        self._given = False  # and its rows are those of the ``slab`` given (a pipe's, kept across passes)
        self._share = share_frames
        self._memo: BatchMemo | None = None  # with batch rows and share_frames: a frame shown twice is decoded once
        self._sink = self._choose_sink(slab if transform is None else 0)
        if self.options.method == "process" and slices is not None:  # workers map the shards
            slices()
        self._plan()
        self._ex: InOrder[_InFlight] | None = None
        self._specs: dict[str, EpisodeSpec] = {}
        self._plain_shapes: dict[str, Shapes] = {}  # episode -> its row shapes without windows (`_shapes`)
        self._done = False
        self._corrupt = 0  # this pass, for the end-of-pass summary
        self._resume: dict | None = None  # the state of a pass shut down with samples in flight
        # a train reader's state is its cursor and settings: keep the cursor per sample, make the dict when asked
        self._cursor = cursor

    def _plan(self) -> None:
        """Samples in flight and per task, for the sink chosen; with video cameras, how far beyond that the reads
        may reach while few GOPs are in flight (`InOrder.room`): a GOP per worker and the next one's first task,
        so no worker waits for the consumer to drain a long GOP before it has another to decode."""
        (prefetch, chunk), num_workers = self._asked, self.options.num_workers
        pickled = self.options.method == "process" and isinstance(self._sink, Allocate)
        chunked = pickled or self._batched
        if self._batched and not pickled:  # a chunk holds at most a batch's rows, so rows in flight scale with it
            rows = self._sink.slabs.size  # type: ignore[attr-defined]
            # a pipe's own Slabs keeps a few slabs across passes: rows in flight beyond one batch (plus the one
            # being filled and the consumer's) would take fresh slabs, a page fault per 4 KB of each; a shared ring
            # is sized for the rows in flight instead, and each process task costs the parent its executor's
            # thread wake-ups, so processes take whole chunks
            shared = isinstance(self._sink, SharedRing)
            chunk = min(chunk, max(1, rows // (2 * num_workers)) if self._given and not shared else rows)
        self.prefetch = prefetch or (2 * chunk if chunked else 4) * num_workers
        self.chunk = max(1, min(chunk, self.prefetch // (2 * num_workers))) if chunked else 1
        self._gops = GopKeys.of(self.fn.frames) if num_workers > 1 else None
        longest = self._gops.longest if self._gops is not None and prefetch is None else 0
        self.reach = max(self.prefetch, num_workers * longest + self.chunk)

    def batch_rows(self, size: int) -> None:
        """Decode frames into rows of ``size``-sample batch buffers, as the `BatchStacker` right after this
        node asks when its builder wires it (``rows=``, `links.RowsProvider`): its batches are then views of those
        buffers, and collation copies no pixels.

        With ``share_frames``, a camera frame that several samples of a batch show is then decoded once.
        Samples go to the workers ``chunk`` per task, threads too: a task per sample costs a future,
        a queue hand-off and GIL switches that leave the decode threads waiting. Nothing changes where a
        ``slab`` was given already, a ``transform`` runs (it may return other arrays), or a pass is running.

        Args:
            size: samples per batch (the stacker's ``batch_size``); rows are counted from each pass's start.
        """
        if self._ex is not None or size <= 0 or self.fn.transform is not None:
            return
        # a slab given already (a pipe's Slabs, kept across passes) stays, and is chunked alike when its rows are
        # batches of ``size``
        given = isinstance(self._sink, BatchRows) and self._sink.slabs.size == size
        if given or isinstance(self._sink, Allocate):
            if not given:
                self._sink = self._choose_sink(Slabs(size))
            self._batched, self._given = True, given
            self._memo = BatchMemo(size, self.fn.frames, self.options.resize) if self._share else None
            self._plan()

    def _choose_sink(self, slab: int | Slabs) -> FrameSink:
        slabs = slab if isinstance(slab, Slabs) else Slabs(slab) if slab else None
        if slabs is None:
            return Allocate()
        if self.options.method == "thread":
            return BatchRows(slabs)
        # processes are given the shared ring's descriptors as they start; where they cannot be (no fork server),
        # their frames come back pickled
        return SharedRing(slabs) if _pool.shares_memory() else Allocate()

    def reset(self, initial_state: dict | None = None) -> None:
        super().reset(initial_state)
        self.shutdown()
        self.source.reset(initial_state[self.SOURCE_KEY] if initial_state else None)
        if self._memo is not None:
            self._memo.start()
        self._done = False
        self._corrupt = 0
        self._resume = None

    def next(self) -> dict:
        self._fill()
        if not self._ex:
            self.shutdown()
            raise StopIteration
        entry, decoded = self._ex.get()
        self._fill()
        if not self._ex:
            self.shutdown()  # the last frame is decoded: release the workers now, not at the next call
        if entry.claim.shared:  # a process wrote these frames into shared rows: nothing was pickled
            decoded = unpack_shared(decoded)
            decoded.fields.update(entry.claim.rows)
        if self._memo is not None:
            spec = self._spec(entry.raw.item.episode)
            self._memo.fill(entry.raw, decoded, spec.cameras)
        out = self._report(entry.raw, decoded)
        if self._done and not self._ex and self._corrupt:
            log.warning("%d corrupt frame(s) skipped this pass (their samples have valid=False); "
                        "re-shard the named shards to recover them", self._corrupt)
            self._corrupt = 0
        return out

    def get_state(self) -> dict[str, Any]:
        # The source is ahead by the frames in flight: resume from the state before the first of them.
        if self._ex:
            return {self.SOURCE_KEY: self._state(self._ex.first().before)}
        if self._resume is not None:
            return {self.SOURCE_KEY: self._resume}
        return {self.SOURCE_KEY: self.source.state_dict()}

    def shutdown(self) -> None:
        """End the pass now: stop the pool (threads joined, processes ended), drop frames in flight, and
        shut the source down. The state still resumes at the first frame not returned; `reset` starts anew."""
        if self._ex:
            self._resume = self._state(self._ex.first().before)
        self._done = True
        if self._ex is not None:
            self._ex.close()
            self._ex = None
            self._sink.end()
        shutdown_node(self.source)

    close = shutdown  # the name callers used before torchdata's `shutdown`

    def _state(self, before: Any) -> dict:
        """The source's state from what `_fill` kept before a sample: the state itself, or a reader's cursor."""
        return before if self._cursor is None else self._cursor.state_at(before)

    def _fill(self) -> None:
        # reset() has initialised the source: BaseNode.__next__ would only check that again, per sample
        take, cursor = self.source.next, self._cursor
        while not self._done and (self._ex is None or self._ex.room(self.prefetch, self.reach)):
            before = self.source.state_dict() if cursor is None else cursor.cursor()
            try:
                raw = take()
            except StopIteration:
                self._done = True
                break
            spec = self._spec(raw.item.episode)
            shapes = self._shapes(spec, raw)
            if self._ex is None:  # first sample of the pass: workers start now, not at reset
                self._sink.start(shapes, self.reach)
                ring = self._sink.slabs.ring() if isinstance(self._sink, SharedRing) else None
                self._ex = InOrder(self.options.method, self.options.num_workers, self.stats, chunk=self.chunk,
                                   lanes=self._gops is not None, ring=ring)
            claim = self._sink.claim(shapes)
            sent = raw if self._memo is None else self._memo.plan(raw, spec.cameras)
            work = portable(sent) if self.options.method == "process" else sent
            fn = decode_shared if claim.shared else decode_into
            self._ex.put(_InFlight(before, sent, claim), fn, self.fn, work, spec, claim.ticket,
                         key=None if self._gops is None else self._gops(sent))
        if self._ex is not None and (self._done or self._ex.idle):  # a partial chunk: nothing else is coming
            self._ex.flush()

    def _shapes(self, spec: EpisodeSpec, raw: RawSample) -> Shapes:
        """Each camera's row shape: ``[3, H, W]``, or ``[steps, 3, H, W]`` for a camera window; a sample without
        windows gets its episode's one dict (kept with its spec), which the sink then recognises by identity."""
        if not raw.windows:
            got = self._plain_shapes.get(raw.item.episode)
            if got is None:
                got = self._plain_shapes[raw.item.episode] = self._row_shapes(spec, raw)
            return got
        return self._row_shapes(spec, raw)

    def _row_shapes(self, spec: EpisodeSpec, raw: RawSample) -> Shapes:
        out = {}
        for c, src in spec.cameras.items():
            w, hw = raw.windows.get(c), self.options.resize or src
            out[c] = (3, *hw) if w is None else (len(w.steps), 3, *hw)
        return out

    def _spec(self, episode: str) -> EpisodeSpec:
        """What decoding needs of an episode, cached for the node's life."""
        spec = self._specs.get(episode)
        if spec is None:
            spec = self._specs[episode] = EpisodeSpec.of(self.index.episode(episode))
        return spec

    def _report(self, raw: RawSample, decoded: Decoded) -> dict:
        """Count the sample's frames; count, log or raise its corrupt cameras and arrays."""
        self.stats.add("frames_decoded", decoded.frames)
        fields, bad = decoded.fields, decoded.corrupt
        if bad:
            reason = decoded.damaged or raw.damaged or "does not decode to what the index describes"
            where = (f"shard {raw.shard} episode {raw.item.episode!r} frame {raw.item.frame} "
                     f"(camera/array {', '.join(bad)})")
            if self.options.on_corrupt == "raise":
                raise ValueError(f"corrupt data in {where}: {reason}; re-shard it, or pass on_corrupt='skip'")
            log.warning("corrupt data in %s: %s; skipped (valid=False)", where, reason)
            self.stats.add("frames_corrupt", len(bad))
            self._corrupt += len(bad)
            fields["valid"] = False
        return fields


Packed = tuple[list[str], int, "str | None", dict[str, Any], tuple[tuple[str, bytearray, str, tuple[int, ...]], ...]]


def decode_shared(fn: SampleDecode, raw: RawSample, spec: EpisodeSpec, ticket: tuple[int, int, int]) -> Packed:
    """In a process worker: `decode_into` shared rows, its result as plain tuples and each array as its bytes.

    Pickling a `Decoded` and the small arrays in it costs tens of microseconds a sample each way (a dataclass
    and an ndarray reduce through copyreg); tuples, bytes and scalars cost about one."""
    out = decode_into(fn, raw, spec, ticket)
    plain, arrays = {}, []
    for k, v in out.fields.items():
        if isinstance(v, np.ndarray) and not v.dtype.hasobject:
            arrays.append((k, bytearray(np.ascontiguousarray(v)), v.dtype.str, v.shape))
        else:
            plain[k] = v
    return out.corrupt, out.frames, out.damaged, plain, tuple(arrays)


def unpack_shared(packed: Packed) -> Decoded:
    """In the parent: the `Decoded` `decode_shared` sent (arrays over their unpickled, writable bytes)."""
    corrupt, frames, damaged, fields, arrays = packed
    for k, data, dtype, shape in arrays:
        fields[k] = np.frombuffer(data, dtype).reshape(shape)
    return Decoded(fields, corrupt, frames, damaged)


def portable(raw: RawSample) -> RawSample | Wire:
    """``raw`` with bytes where a reader handed out memoryviews (slices of mapped shards), which do not pickle
    to a worker process; ``raw`` itself when it holds none (bytes, or `ShardSlice` references the worker
    resolves), or, when its members are references into one shard and nothing else, those as plain tuples
    (`to_wire`; `SampleDecode` takes either). Its crc32 checks of memoryviews are made here (the worker would
    need the whole frames sent beside their members); checks of references go to the worker."""
    wire = to_wire(raw)
    if wire is not None:
        return wire
    if raw.checks and not isinstance(raw.checks[0][1], ShardSlice):
        raw = dataclasses.replace(raw, checks=(), damaged=raw.damaged or crc_mismatch(raw.checks))
    views = any(isinstance(v, memoryview) for v in raw.members.values()) or any(
        isinstance(v, memoryview) for w in raw.windows.values() for v in w.data.values())
    if not views:
        return raw
    return dataclasses.replace(
        raw, members={k: bytes(v) for k, v in raw.members.items()},
        windows={k: dataclasses.replace(w, data={s: bytes(v) for s, v in w.data.items()})
                 for k, w in raw.windows.items()})
