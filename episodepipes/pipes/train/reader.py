"""`train_pipe`: shuffled training frames with history/horizon windows, even over ranks, exactly resumable.

Graph: `TrainReader` (keyed permutation, read by seeking through the byte-range index) -> `Decoder`
(its `SampleDecode` runs the transform in the workers too) -> `BatchStacker`.
The graph persists across passes: a new ``iter()`` continues with the next epoch, as Lightning expects
of a train loader it iterates once per epoch. The resume state is a cursor ``{seed, epoch, pos, stop, consumed}``
and the settings it is valid under, which ``load_state_dict`` checks, allowing another world size at the same
global batch (`TrainReader`; the checks are in `train_state`, with `TrainPipe`). A mapping of sources
is a mixture, built in `train_mix` from one `TrainReader` per source.
"""

from __future__ import annotations

import logging
import os
import zlib
from collections.abc import Callable, Mapping, Sequence, Set
from typing import Any

import numpy as np
from torchdata.nodes import BaseNode

from episodepipes.format import sample_key
from episodepipes.index import Episode, EpisodeIndex
from episodepipes.pipes import block_read
from episodepipes.pipes._decode.mapped import MappedShards, ShardSlice, frame_members
from episodepipes.pipes.batch import BatchStacker
from episodepipes.pipes.builders import check_batchable, dist_rank_world, open_index
from episodepipes.pipes.decode import CHUNK, Decoder
from episodepipes.pipes.options import DecodeOptions
from episodepipes.pipes.order import block_order as bo
from episodepipes.pipes.order.block_order import BlockOrder
from episodepipes.pipes.order.permute import MISMATCH, IndexShuffle, rank_positions, steps_per_epoch
from episodepipes.pipes.order.shuffle import FrameTable
from episodepipes.pipes.order.window import Window, damaged_sample, fields_by_step, plan_windows, window_sample
from episodepipes.pipes.plan import Item
from episodepipes.pipes.sample import RawSample
from episodepipes.pipes.select import Where, select
from episodepipes.pipes.stats import Stats
from episodepipes.pipes.train import state as ts
from episodepipes.pipes.train.state import TrainPipe
from episodepipes.pipes.transform import sample_transform
from episodepipes.remote.ahead import ReadAhead
from episodepipes.shardio import open_source
from episodepipes.tarmembers import frame_fields

log = logging.getLogger(__name__)
READ_AHEAD = 4  # batches a remote root's reader fetches ahead of the one it yields
SHUFFLES = ("full", "block")
STEPS_AHEAD = 8  # global steps whose order and byte ranges `TrainReader` computes in one numpy pass


class TrainReader(ts.EpochCursor, BaseNode[RawSample]):
    """Yield this rank's window samples, epoch after epoch, in the seeded elastic order of `permute`.

    A pass runs ``epochs`` epochs (forever when None). ``reset(None)`` starts a new pass at the first
    epoch not yet begun; a restored state continues its pass, and one saved at the end of a pass is
    exhausted (torchdata's contract: the `Loader` then starts the next pass).

    Epoch ``e``'s global stream is `IndexShuffle.of(frames, seed=seed, epoch=e)` (nothing per frame is
    stored); global step ``s`` is its block ``[s*G, (s+1)*G)``, ``G = world_size * batch_size``, and this
    rank takes the entries `rank_positions` gives it (every ``world_size``-th from ``rank``), so ``pos``
    samples on each rank are the first ``consumed = pos * world_size`` entries of the stream.

    The state is that cursor, ``{seed, epoch, pos, stop, consumed}``, plus what it depends on:
    ``world_size``, ``batch_size``, ``global_batch``, ``frames`` and ``plan`` (`FrameTable.fingerprint`),
    ``windows`` (key -> [first, last]) and ``rank``. `check_state` refuses a state that differs in
    ``seed``, ``frames``, ``plan`` or ``windows``. ``rank`` may differ (Lightning saves rank 0's state and
    every rank loads it), and so may ``world_size`` and ``batch_size`` at the same ``global_batch``: the
    global stream then continues at step ``consumed // G`` (elastic resume, exact, from a batch boundary).
    Another ``global_batch`` is refused unless ``on_resize`` is ``"next_step"`` or ``"next_epoch"``
    (`resume_point`: exact where the new ``G`` divides ``consumed``, else a logged skip).

    With ``blocks=(block_frames, window_blocks)`` the stream is `block_order.BlockOrder` instead (the same
    cursor, deal and checks; the state adds ``shuffle``, the block layout, refused when it differs), and a
    remote root's read-ahead fetches whole windows of blocks (`_fetch_window`) instead of batches.
    """

    SEED_KEY, EPOCH_KEY, POS_KEY, STOP_KEY = ts.SEED, ts.EPOCH, ts.POS, ts.STOP
    WORLD_KEY, RANK_KEY, BATCH_KEY = ts.WORLD, ts.RANK, ts.BATCH
    FRAMES_KEY, PLAN_KEY, WINDOWS_KEY = ts.FRAMES, ts.PLAN, ts.WINDOWS
    CONSUMED_KEY, GLOBAL_KEY = ts.CONSUMED, ts.GLOBAL

    def __init__(self, index: EpisodeIndex, episodes: Sequence[Episode], *, windows: Mapping[str, Window], seed: int,
                 rank: int, world_size: int, batch_size: int, epochs: int | None, stats: Stats | None = None,
                 on_resize: str = "refuse", blocks: tuple[int, int] | None = None) -> None:
        super().__init__()
        self.index, self.episodes, self.windows = index, list(episodes), dict(windows)
        self.seed, self.rank, self.world_size, self.batch_size, self.epochs = seed, rank, world_size, batch_size, epochs
        self.stats = stats if stats is not None else Stats()
        self.table = FrameTable([e.id for e in self.episodes], [e.length for e in self.episodes])
        if on_resize not in MISMATCH:
            raise ValueError(f"{on_resize=} should be one of {MISMATCH}")
        self.on_resize = on_resize
        self.per_epoch = steps_per_epoch(len(self.table), world_size=world_size, batch_size=batch_size) * batch_size
        if self.per_epoch == 0:
            raise ValueError(f"{len(self.table)} frames make no full batch of batch_size={batch_size} on each of "
                             f"world_size={world_size} ranks; lower batch_size")
        self._setup = {self.WORLD_KEY: world_size, self.RANK_KEY: rank, self.BATCH_KEY: batch_size,
                       self.GLOBAL_KEY: world_size * batch_size, self.FRAMES_KEY: len(self.table),
                       self.PLAN_KEY: self.table.fingerprint(),
                       self.WINDOWS_KEY: {k: [w.first, w.last] for k, w in sorted(self.windows.items())}}
        self.blocks = None if blocks is None else block_read.layout_of(index, self.episodes, *blocks)
        if self.blocks is not None:
            self._setup[ts.SHUFFLE] = self.blocks.describe()
        self._orders: dict[int, BlockOrder] = {}  # the last epochs' block orders (O(blocks) each), never saved
        self._batch_windows: np.ndarray | None = None  # the block order's window of each entry of self._batch
        self._step_windows: np.ndarray | None = None  # that of the step `_frames_of` gave last
        self._epoch = self._pos = 0
        self._stop: int | None = None
        self._shuffle: tuple[int, IndexShuffle | BlockOrder] | None = None  # (epoch, its order), never saved
        self._batch: tuple[int, int, np.ndarray] | None = None  # (epoch, first step, [steps, batch] frames)
        # a local folder's descriptors are closed in close() and reopened on demand; a remote index's own source
        # stays open (its connections), and is read only here, in the main process
        self.source = index.source if index.remote else open_source(index.root)
        self._names = [s.name for s in index.shards]
        self._where = [os.path.join(str(self.source.root), n) for n in self._names]  # for messages
        # a remote root: each batch's frames in one read_many, the next batches' fetched while this one decodes;
        # in the block order each window's blocks in one read_many, the next windows' while this one decodes
        self._ahead: ReadAhead | None = None
        if index.remote and self.blocks is None:
            self._ahead = ReadAhead(self._fetch_batch, self._following, depth=READ_AHEAD)
        elif index.remote and self.blocks is not None:
            frames = self.blocks.block_frames * self.blocks.window_blocks
            self._ahead = ReadAhead(self._fetch_window, self._following_window,
                                    depth=max(1, -(-READ_AHEAD * batch_size // frames)))
        self._slices = False  # frames as ShardSlice references, for decode processes (send_slices)
        self._locs: dict[int, tuple[int, int, int, int, int, int | None]] = {}  # the cached steps' frames (_located)
        self._prefixes: dict[int, bytes] = {}  # episode position -> its member names' prefix (`_plain_sample`)
        self._mapped: MappedShards | None = None  # a local root's shards, mapped on first use (`_shards`)
        self._starts = np.asarray(self.table.starts, np.int64)  # each episode's first flat frame
        self._row_starts = np.asarray([e.rows.start for e in self.episodes], np.int64)  # its first index row

    def _order(self, epoch: int) -> IndexShuffle | BlockOrder:
        """Epoch ``epoch``'s order of the frames (pure of the cursor: the read-ahead threads call it too)."""
        if self.blocks is None:
            return IndexShuffle.of(len(self.table), seed=self.seed, epoch=epoch)
        got = self._orders.get(epoch)
        if got is None:
            got = self.blocks.order(seed=self.seed, epoch=epoch)
            self._orders = {**{k: v for k, v in self._orders.items() if epoch - 1 <= k <= epoch + 1}, epoch: got}
        return got

    @property
    def _size(self) -> int:
        return len(self.table)

    def next(self) -> RawSample:
        if self._stop is not None and self._epoch >= self._stop:
            raise StopIteration
        step, i = divmod(self._pos, self.batch_size)
        flat = int(self._frames_of(self._epoch, step)[i])
        key = (self._epoch, step) if self._batch_windows is None else (self._epoch, int(self._step_windows[i]))
        raw = self._sample(flat, None if self._ahead is None else self._ahead.get(key).get(flat))
        self._pos += 1
        if self._pos == self.per_epoch:
            self._epoch, self._pos = self._epoch + 1, 0
        return raw

    def close(self) -> None:
        """Close shard files; they are reopened on demand."""
        if not self.index.remote:
            self.source.close()
            self._mapped = None  # the slices samples still hold keep their mappings alive
        if self._ahead is not None:
            self._ahead.close()

    def _frames_of(self, epoch: int, step: int) -> np.ndarray:
        """This rank's flat frame numbers at global ``step`` of ``epoch`` (one batch's worth).

        Computed for `STEPS_AHEAD` steps at once and cached: per batch, numpy's per-call cost is most of the
        permutation's."""
        got = self._batch
        if got is None or got[0] != epoch or not 0 <= step - got[1] < len(got[2]):
            if self._shuffle is None or self._shuffle[0] != epoch:
                self._shuffle = (epoch, self._order(epoch))
            order = self._shuffle[1]
            steps = max(1, min(STEPS_AHEAD, self.per_epoch // self.batch_size - step))
            at = rank_positions(step, rank=self.rank, world_size=self.world_size, batch_size=self.batch_size,
                                steps=steps).reshape(steps, self.batch_size)
            got = self._batch = (epoch, step, order(at))
            self._batch_windows = order.window_of(at) if isinstance(order, BlockOrder) and self._ahead else None
        if self._batch_windows is not None:
            self._step_windows = self._batch_windows[step - got[1]]
        return got[2][step - got[1]]

    def _sample(self, flat: int, got: dict[int, bytes] | None = None) -> RawSample:
        e, t, *at = self._located(flat)
        ep = self.episodes[e]
        if got is None and not self.windows and not self.index.remote:
            raw = self._plain_sample(e, t, *at)
            if raw is not None:
                return raw
        read: dict[int, dict[str, bytes]] = {}
        steps = ((t, None), *fields_by_step(t, ep.length, self.windows).items())
        if got is None:
            got = self._fetch(ep, [s for s, _ in steps]) if self.index.remote else {}
        checks: list[tuple[int, bytes, int]] = []  # crc32 checks left to the decode worker (local shards)
        damaged = [why for s, want in steps
                   if (why := self._read(ep, s, want, read, got.get(s), checks, at if s == t else None)) is not None]
        self.stats.add("frames_read", len(read))
        item = Item(ep.id, t)
        shard = self._names[at[0]]
        if damaged:  # nothing of it is decoded: the Decoder gives zeros and counts it corrupt
            return damaged_sample(item, shard, ep.length, self.windows, damaged[0])
        raw = window_sample(item, shard, ep.length, self.windows, read)
        raw.checks = tuple(checks)
        return raw

    def _shards(self) -> MappedShards:
        """The local root's shard mappings, made at the first frame read in place and dropped by `close`."""
        if self._mapped is None:
            self._mapped = MappedShards(self.source)
        return self._mapped

    def _plain_sample(self, e: int, t: int, shard: int, start: int, end: int, crc: int | None) -> RawSample | None:
        """`_sample` of a frame without windows in a mapped local shard whose members `frame_members` parses (the
        usual case), with none of the window bookkeeping; None for anything else, which `_sample` then reads."""
        view = self._shards().frame(self._names[shard], start, end)
        prefix = self._prefixes.get(e)
        if prefix is None:
            prefix = self._prefixes[e] = self.episodes[e].id.encode() + b"/"
        got = None if view is None else frame_members(view, prefix + b"%06d." % t)  # sample_key's bytes
        if got is None or not got[0]:  # a frame without members is checked where `_read` checks it
            return None
        spans, n = got
        self.stats.add("bytes_read", n)
        self.stats.add("frames_read")
        whole: memoryview | ShardSlice
        if self._slices:
            path = self._where[shard]
            members = {f: ShardSlice(path, start + a, b - a) for f, (a, b) in spans.items()}
            whole = ShardSlice(path, start, len(view))  # type: ignore[arg-type]
        else:
            members = {f: view[a:b] for f, (a, b) in spans.items()}  # type: ignore[misc]
            whole = view  # type: ignore[assignment]
        return RawSample(Item(self.episodes[e].id, t), self._names[shard], members,  # type: ignore[arg-type]
                         checks=() if crc is None else ((t, whole, crc),))  # type: ignore[arg-type]

    def _located(self, flat: int) -> tuple[int, int, int, int, int, int | None]:
        """(episode position, step, shard, start byte, end byte, crc32 or None) of flat frame ``flat``.

        Looked up for the `STEPS_AHEAD` batches `_frames_of` cached at once (`EpisodeIndex.frame_ranges`): per
        frame, numpy's per-call cost is most of the lookup. A frame outside them is looked up alone.
        """
        loc = self._locs.get(flat)
        if loc is not None:
            return loc
        self._frames_of(self._epoch, self._pos // self.batch_size)
        block = self._batch[2]  # type: ignore[index]  # the cached steps around this reader's cursor
        if flat not in block:  # not this reader's own cursor (a mixture's draw): one frame, without numpy
            e, t = self.table.locate(flat)
            ep = self.episodes[e]
            return (e, t, *ep.frame_range(t), ep.frame_crc(t))
        flats = block.ravel()
        es = np.searchsorted(self._starts, flats, side="right") - 1
        ts_ = flats - self._starts[es]
        rows = self._row_starts[es] + ts_
        shard, a, b = self.index.frame_ranges(rows)
        crcs = self.index.frame_crcs(rows)
        self._locs = dict(zip(flats.tolist(), zip(es.tolist(), ts_.tolist(), shard.tolist(), a.tolist(), b.tolist(),
                                                  [None] * len(flats) if crcs is None else crcs.tolist())))
        return self._locs[flat]

    def _following(self, key: tuple[int, int]) -> tuple[int, int] | None:
        """The (epoch, step) after ``key`` in this pass, or None past its last epoch."""
        epoch, step = key
        if (step + 1) * self.batch_size < self.per_epoch:
            return epoch, step + 1
        return (epoch + 1, 0) if self._stop is None or epoch + 1 < self._stop else None

    def _fetch_batch(self, key: tuple[int, int]) -> dict[int, dict[int, bytes]]:
        """Every frame this rank's batch at ``key`` (epoch, step) reads, windows included: flat -> step -> bytes.

        Pure of the reader's cursor (it runs in a read-ahead thread): the order is recomputed from the seed.
        """
        epoch, step = key
        at = rank_positions(step, rank=self.rank, world_size=self.world_size, batch_size=self.batch_size)
        wants: list[tuple[int, int, int, int, int]] = []  # flat, step, shard, start, end
        for flat in map(int, self._order(epoch)(at)):
            e, t = self.table.locate(flat)
            ep = self.episodes[e]
            for s in (t, *fields_by_step(t, ep.length, self.windows)):
                wants.append((flat, s, *ep.frame_range(s)))
        by_shard: dict[int, list[int]] = {}
        for k, w in enumerate(wants):
            by_shard.setdefault(w[2], []).append(k)
        datas = self.source.read_many([(self._names[shard], [(wants[k][3], wants[k][4] - wants[k][3]) for k in ks])
                                       for shard, ks in by_shard.items()])
        out: dict[int, dict[int, bytes]] = {}
        for ks, ds in zip(by_shard.values(), datas):
            for k, data in zip(ks, ds):
                out.setdefault(wants[k][0], {})[wants[k][1]] = data
        return out

    def _following_window(self, key: tuple[int, int]) -> tuple[int, int] | None:
        """The (epoch, window) of the block order after ``key`` that holds a position of this rank, or None."""
        return block_read.following(key, self._order, rank=self.rank, world_size=self.world_size,
                                    used=self.per_epoch * self.world_size, stop=self._stop)

    def _fetch_window(self, key: tuple[int, int]) -> dict[int, dict[int, bytes]]:
        """`_fetch_batch` for a window of the block order: flat -> step -> bytes of this rank's frames in it,
        read with the whole blocks they lie in (`block_read.read_window`). Pure of the reader's cursor."""
        order = self._order(key[0])
        at = block_read.positions_in(order, key[1], rank=self.rank, world_size=self.world_size,
                                     used=self.per_epoch * self.world_size)
        return block_read.read_window(self.source, self._names, self.table, self.episodes, self.windows,
                                      self.blocks.bounds, order(at))  # type: ignore[union-attr, arg-type]

    def _fetch(self, ep: Episode, steps: list[int]) -> dict[int, bytes]:
        """The whole bytes of each step's frame through the index's byte source (a remote root).

        One `read_ranges` per shard: a window's frames are adjacent, so they come as one ranged GET instead
        of a request per tar header. Array-only steps are fetched whole too (their JPEGs included): bytes
        are cheaper than round trips.
        """
        by_shard: dict[int, list[tuple[int, int, int]]] = {}
        for s in steps:
            shard, start, end = ep.frame_range(s)
            by_shard.setdefault(shard, []).append((s, start, end))
        out: dict[int, bytes] = {}
        for shard, frames in by_shard.items():
            datas = self.source.read_ranges(self._names[shard], [(a, b - a) for _, a, b in frames])
            out.update((s, data) for (s, _, _), data in zip(frames, datas))
        return out

    def _read(self, ep: Episode, step: int, want: set[str] | None, into: dict[int, dict[str, bytes]],
              fetched: bytes | None = None, checks: list[tuple[int, bytes, int]] | None = None,
              at: list | None = None) -> str | None:
        """Read ``step``'s fields into ``into[step]``; why its bytes are damaged, or None.

        A frame read whole (the current step, and window steps of a camera) is checked against its crc32 in
        the index; a step read only for arrays is not (checking it would mean reading the JPEGs beside them).
        ``fetched`` is the frame's bytes when `_fetch` read them already (a remote root), ``at`` its
        ``[shard, start, end, crc32]`` when `_located` looked them up already. With ``checks``, a
        frame (of a local shard, or fetched) is not checked here but appended to it, for the decode worker to check
        (`RawSample.checks`): zlib releases the GIL, and this thread then waits behind the decode threads.
        """
        whole = want is None or any(f.endswith(".jpg") for f in want)
        if at is None:
            shard, start, end = ep.frame_range(step)
            crc = ep.frame_crc(step) if whole else None
        else:
            shard, start, end, crc = at
            crc = crc if whole else None
        name, path = self._names[shard], self._where[shard]
        if fetched is None and not self.index.remote:  # slices of mapped shards: no read call, no copy
            view = self._shards().frame(name, start, end)
            got = None if view is None else frame_members(view, sample_key(ep.id, step).encode() + b".",
                                                          want if crc is None else None)
            if got is not None:  # plain members: parsed in place (anything else takes frame_fields below)
                return self._mapped_fields(step, view, got, path, start, crc, into, checks)
            read = self._shards().read
        else:
            read = self.source.read
        if fetched is not None:
            def read(_: str, offset: int, size: int) -> bytes:
                return fetched[offset - start:offset - start + size]
        reads: list[bytes | memoryview] = []

        def pread(size: int, offset: int) -> bytes | memoryview:
            reads.append(read(name, offset, size))
            return reads[-1]

        try:
            fields, n = frame_fields(pread, start, end, ep.id, step, want if crc is None else None, where=path)
        except ValueError:  # a tar header the damage hit; a frame cut short stays an error
            if crc is None or not reads or len(reads[0]) != end - start or zlib.crc32(reads[0]) == crc:
                raise
            fields, n = {}, len(reads[0])
        self.stats.add("bytes_read", n)
        into[step] = fields
        if crc is not None and checks is not None and fields:
            checks.append((step, reads[0], crc))
        elif crc is not None and zlib.crc32(reads[0]) != crc:
            return f"frame {step} does not match its crc32 in the index"
        return None

    def _mapped_fields(self, step: int, view: memoryview, got: tuple[dict[str, tuple[int, int]], int], path: str,
                       start: int, crc: int | None, into: dict[int, dict[str, bytes]],
                       checks: list[tuple[int, bytes, int]] | None) -> str | None:
        """`_read` of a frame of a mapped shard whose members `frame_members` parsed: slices of the mapping, or
        `ShardSlice` references to it where decode processes read the frames (`send_slices`)."""
        spans, n = got
        self.stats.add("bytes_read", n)
        if self._slices:
            into[step] = {f: ShardSlice(path, start + a, b - a) for f, (a, b) in spans.items()}  # type: ignore[misc]
            whole: bytes | memoryview | ShardSlice = ShardSlice(path, start, len(view))
        else:
            into[step] = {f: view[a:b] for f, (a, b) in spans.items()}  # type: ignore[misc]
            whole = view
        if crc is not None and checks is not None and spans:
            checks.append((step, whole, crc))  # type: ignore[arg-type]
        elif crc is not None and zlib.crc32(view) != crc:
            return f"frame {step} does not match its crc32 in the index"
        return None

    def send_slices(self) -> None:
        """Hand frames of local shards out as `ShardSlice` references, which a decode process resolves against
        its own mapping of the shard (`Decoder` asks this of its source for ``method="process"``): no frame
        bytes are copied or pickled. Frames read otherwise (a remote root, a member layout the fast path does
        not parse) still come as bytes."""
        self._slices = True


def train_pipe(index: EpisodeIndex | str | os.PathLike | Mapping[str, Any], *, split: str = "train",
               batch_size: int, seed: int,
               history: Mapping[str, int] | None = None, horizon: Mapping[str, int] | None = None,
               rank: int | None = None, world_size: int | None = None, num_workers: int = 2, method: str = "thread",
               transform: Callable[[dict[str, Any]], dict[str, Any]] | None = None, epochs: int | None = 1,
               resize: tuple[int, int] | None = None, on_corrupt: str = "skip", on_resize: str = "refuse",
               episodes: Sequence[str] | None = None, where: Where | None = None,
               stop: str | None = None, shuffle: str = "full", block_frames: int | None = None,
               window_blocks: int | None = None) -> TrainPipe:
    """Shuffled frames of ``split``: ``epochs`` epochs per ``iter()``, the same whole number of batches per rank.

    Order: epoch ``e`` is a keyed permutation of every frame (`permute.IndexShuffle`, from ``seed`` and
    ``e``, computed per batch, never stored); rank ``r`` takes every ``world_size``-th entry from ``r``,
    trimmed to ``len(pipe) // epochs`` full batches (drop-last: at most ``world_size * batch_size - 1``
    frames sit out an epoch, different ones each epoch). Each ``iter()`` continues with the next epochs;
    ``epochs=None`` is one endless pass.

    Block order (``shuffle="block"``, for object stores): the frames, in index order, are cut into blocks of
    ``block_frames`` consecutive frames of one shard (contiguous bytes); the blocks are permuted, keyed by
    ``seed`` and the epoch, and each run of ``window_blocks`` consecutive blocks (a window) has its frames
    shuffled among themselves (`block_order`). It is still a permutation of every frame, a function of
    ``(seed, epoch)`` and the shard layout, so the deal over ranks, drop-last, resume and elastic resume are the
    full shuffle's. A remote root then reads each block with one ranged GET, a window ahead, instead of one GET
    per frame, and keeps this rank's frames of at most ``depth + 1`` windows in memory (``depth`` =
    ``max(1, ceil(4 * batch_size / (block_frames * window_blocks)))``); with ``cache_whole`` the shards of
    the next window download while this one decodes. The price is the mix: a batch holds frames of about
    ``window_blocks`` blocks (a few episodes each), not of the whole dataset; raise ``window_blocks`` for
    more. Every rank draws from the same windows, so each rank fetches the whole of every block it touches:
    with ``world_size`` ranks each one transfers about ``world_size`` times its own frames' bytes (the whole
    dataset per epoch). Ranks of one machine that share ``RemoteOptions(cache_dir=...)`` fetch each block once
    between them: one claims it, the others wait for its cache entry (`remote.cache.RangeCache`).
    Local shards are memory-mapped and read in place, in the same order.

    Windows (see `episodepipes.pipes.order.window`): ``history={"state": K}`` gives steps ``t-K+1..t`` (the
    current step last), ``horizon={"action": H}`` gives ``t..t+H-1`` (the current step first), both
    padded at episode edges with the nearest real step and marked in ``<key>_pad``. Only the returned
    steps' members are read and decoded.

    ``episodes=`` (ids, all in ``split``) and ``where=`` (a predicate over each episode's attributes: split,
    length, fps, prompt, cameras, arrays and the extra ``meta.json`` keys, see
    `episodepipes.pipes.select.attributes`) narrow the episodes, resolved from the index alone.

    Every episode of the split must have the same cameras, and arrays of the same keys, dtypes and shapes:
    a mismatch is refused when the pipe is built, naming both episodes and the key (nothing is cast).
    Frames read whole (each sample's current step, and the steps of camera windows) are checked against
    the index's crc32; a mismatch makes the sample corrupt, as a JPEG that does not decode (``on_corrupt``).

    ``transform(sample) -> sample`` runs per sample in the decode workers, before collation (so it must
    pickle for ``method="process"``); ``episode``, ``frame``, ``timestamp``, ``valid`` and ``prompt``
    are restored after it.

    State: ``state_dict()`` holds a cursor (epoch, this rank's ``pos``, and ``consumed``, the samples taken
    globally in the epoch) and what it depends on (seed, world size, batch size, their product the global
    batch, frame count and plan fingerprint, windows); see `TrainReader`. ``load_state_dict`` resumes it
    exactly, in any step, in a pipe of the same ``seed``, windows and episodes, and refuses others by name.
    Elastic rule: the global stream depends on ``world_size * batch_size`` only, so a state saved at one
    world size resumes at another with the same product (any ``batch_size``), from a batch boundary, with no
    sample repeated or skipped against an uninterrupted run at the new size; any rank's state will do (every
    rank is at the same global position). Another global batch is refused, saying what differs, unless
    ``on_resize`` is ``"next_step"`` (exact where the new global batch divides ``consumed``, else skip to its
    next step) or ``"next_epoch"`` (start the next epoch); a skip is logged as a warning.

    Mixtures: ``index`` may be ``{name: Source(root, weight, keys=...)}`` (`train_mix.Source`; the one form,
    a tuple or a list of sources is refused). Global step ``s`` is the block ``[s*G, (s+1)*G)`` of the
    sources' deterministic interleave (`mixture.Mixture`), so every step, and every run of steps, holds each
    source's share within a small constant (within one sample for two sources); a step's samples are dealt to
    the ranks in a keyed order, and each source's frames come in their own keyed order per epoch.
    ``stop="cycle"`` (the default) ends an epoch when every source has given each of its frames (a smaller
    source starts a new order meanwhile); ``"first_exhausted"`` ends it just before any source would repeat.
    ``keys=`` renames and selects each source's cameras and arrays so batches stack; a mismatch that remains
    (a missing key, another dtype, shape or camera size) is refused when the pipe is built, naming both
    sources, episodes and the key. ``history``/``horizon`` and ``transform`` use the batch keys; the
    transform sees ``sample["source"]`` (so `normalize.PerSource` normalizes each source by its own
    statistics), and each batch has ``batch["source"]``, the source of each sample. ``episodes``/``where`` go
    per source (`Source`), ``split`` is every source's unless its `Source` says otherwise. The state adds the
    sources, weights and stop rule, and a state of another mixture is refused naming what differs.

    Args:
        index: an open `EpisodeIndex`, or the shard folder (or its ``index.json``) to open; or a mixture,
            ``{name: Source(...)}`` (names without ``:``), as above.
        split: the split whose frames are shuffled; one with no episodes is refused, naming the splits there.
        batch_size: samples per batch, an int >= 1; every batch is full (drop-last), and a split with too
            few frames for one full batch on every rank is refused.
        seed: a non-negative int fixing every epoch's order (required: a resumed run must use the same).
        history: ``{key: K}``, K >= 1 steps ending at the current one, per camera or array key; None: none.
            An unknown key is refused, listing the known ones.
        horizon: ``{key: H}``, H >= 1 steps starting at the current one, per camera or array key; None: none.
        rank: this process's rank, ``0 <= rank < world_size``. None (with ``world_size``): taken from
            torch.distributed when it is initialised, else 0; a pipe whose rank was inferred checks it
            against the running process group at each ``iter()`` (a pipe built before the group started
            would give every rank the same batches).
        world_size: the number of ranks the frames are split over, an int >= 1; None as for ``rank``.
        num_workers: decode workers (threads or processes), an int >= 1.
        method: ``"thread"`` (``cv2.imdecode`` releases the GIL) or ``"process"`` (for graphs whose other
            stages hold the GIL); anything else is refused.
        transform: ``transform(sample) -> sample`` on each decoded sample dict, in the decode workers, before
            collation; with ``method="process"`` it must pickle (checked when the pipe is built). The
            ``episode``, ``frame``, ``timestamp``, ``valid`` and ``prompt`` entries are restored after it.
            None: no transform.
        epochs: epochs per ``iter()``, a positive int, and ``len()`` is ``epochs`` times the batches per
            epoch; None is one endless pass with no ``len()`` (bound training by steps).
        resize: ``(H, W)``, two ints >= 1, every camera is decoded to; None keeps the stored size, and then
            every episode's cameras must have the same size.
        on_corrupt: ``"skip"`` (a sample with a frame that fails its crc32 or does not decode comes as zeros
            with ``valid=False``, counted in ``stats["frames_corrupt"]`` and logged) or ``"raise"``.
        episodes: ids of the episodes to read, all in ``split``; None for every one.
        where: ``where(attributes) -> bool``, keeping the episodes it is True for; None keeps all.
        on_resize: what ``load_state_dict`` does with a state of another global batch: ``"refuse"`` (the
            default), ``"next_step"`` or ``"next_epoch"``, as above.
        stop: a mixture's stop rule, ``"cycle"`` (None: the default) or ``"first_exhausted"``, as above; a
            pipe of one source takes None only.
        shuffle: ``"full"`` (the default: every frame anywhere in the epoch) or ``"block"`` (the block order,
            as above); a mixture takes ``"full"`` only.
        block_frames: with ``shuffle="block"``, the frames per block, an int >= 1 (None: 64; a block also
            ends at a shard's end). Larger blocks mean fewer, bigger GETs and less mix.
        window_blocks: with ``shuffle="block"``, the blocks whose frames are shuffled together, an int >= 1
            (None: 8). More mix, and more memory (a window's frames are held until it is consumed).
    """
    options = DecodeOptions(num_workers=num_workers, method=method, resize=resize, on_corrupt=on_corrupt)
    if isinstance(index, Sequence | Set) and not isinstance(index, str | bytes):
        raise TypeError(f"train_pipe got a {type(index).__name__} of sources; a mixture is a dict "
                        "{name: Source(root, weight)} (from episodepipes.pipes import Source)")
    mixture = isinstance(index, Mapping)
    if not mixture and stop is not None:
        raise ValueError(f"{stop=} is a mixture's stop rule; train_pipe of one source takes stop=None")
    if mixture and (episodes is not None or where is not None):
        raise ValueError("episodes= and where= choose one source's episodes; for a mixture pass them per source: "
                         "Source(root, weight, episodes=..., where=...)")
    inferred = rank is None or world_size is None  # then iter() checks them against torch.distributed's
    rank, world_size = dist_rank_world(rank, world_size)
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise ValueError(f"seed={seed!r} should be a non-negative int (it fixes every epoch's order)")
    if epochs is not None and (isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1):
        raise ValueError(f"epochs={epochs!r} should be a positive int, or None for an endless (step-based) pass")
    blocks = block_options(shuffle, block_frames, window_blocks)
    if mixture and blocks is not None:
        raise ValueError(f"{shuffle=} is not supported for a mixture of sources; pass shuffle='full' (the default), "
                         "or train on one source")
    checked = sample_transform(transform, method=method, pipe="train_pipe")
    if mixture:
        from episodepipes.pipes.train.mix import mixture_pipe  # it builds on this module

        return mixture_pipe(index, split=split, batch_size=batch_size, seed=int(seed), history=history,
                            horizon=horizon, rank=rank, world_size=world_size, inferred=inferred, options=options,
                            transform=checked, epochs=epochs, on_resize=on_resize, stop=stop or "cycle")
    idx = open_index(index)
    episodes = select(idx, split, episodes=episodes, where=where)
    check_batchable(episodes, resize)  # so episode 0's array specs are every episode's
    from episodepipes.pipes.train import packed as train_packed  # it builds on this module

    train_packed.check_trainable(idx, str(idx.root))
    windows = plan_windows(history, horizon, cameras=set(episodes[0].cameras), arrays=set(episodes[0].arrays))
    stats = Stats()
    reader = train_packed.reader_class(idx)(idx, episodes, windows=windows, seed=int(seed), rank=rank,
                                            world_size=world_size, batch_size=batch_size, epochs=epochs, stats=stats,
                                            on_resize=on_resize, blocks=blocks)
    dec = Decoder(reader, idx, options, stats=stats, transform=checked, frames=train_packed.frames_of(idx),
                  share_frames=True, chunk=task_chunk(options, batch_size))
    per = reader.per_epoch // batch_size
    log.debug("train_pipe: %d frames, %d batches per epoch on rank %d of %d", len(reader.table), per, rank,
              world_size)
    return TrainPipe(BatchStacker(dec, batch_size=batch_size, stats=stats),
                     length=None if epochs is None else epochs * per, index=idx, stats=stats, reader=reader,
                     rank_world=(rank, world_size) if inferred else None)


def task_chunk(options: DecodeOptions, batch_size: int) -> int:
    """Samples per decode task: for processes at least a batch's share per worker (``ceil(batch / workers)``),
    since each task costs the parent and a worker messages, semaphores and thread wake-ups; else the
    `Decoder`'s default. (Threads gain nothing from larger tasks, and their prefetch would double.)"""
    if options.method != "process":
        return CHUNK
    return max(CHUNK, -(-batch_size // options.num_workers))


def block_options(shuffle: str, block_frames: int | None, window_blocks: int | None) -> tuple[int, int] | None:
    """``(block_frames, window_blocks)`` of ``shuffle="block"``, None for the full shuffle; bad options refused."""
    if shuffle not in SHUFFLES:
        raise ValueError(f"{shuffle=} should be one of {SHUFFLES}")
    if shuffle == "full":
        if block_frames is not None or window_blocks is not None:
            raise ValueError(f"{block_frames=} and {window_blocks=} set the block order; pass shuffle='block' too, "
                             "or leave them None")
        return None
    return (bo.check_count("block_frames", bo.DEFAULT_BLOCK_FRAMES if block_frames is None else block_frames),
            bo.check_count("window_blocks", bo.DEFAULT_WINDOW_BLOCKS if window_blocks is None else window_blocks))
