"""`TrainReader`, the node `train_pipe` (`builder`) reads through: shuffled training frames with history/horizon
windows, even over ranks, exactly resumable.

Graph: `TrainReader` (keyed permutation, read by seeking through the byte-range index) -> `Decoder`
(its `SampleDecode` runs the transform in the workers too) -> `BatchStacker`.
The graph persists across passes: a new ``iter()`` continues with the next epoch, as Lightning expects
of a train loader it iterates once per epoch. The resume state is a cursor ``{seed, epoch, pos, stop, start,
consumed}`` and the settings it is valid under, which ``load_state_dict`` checks, allowing another world size at
the same global batch (`TrainReader`; the checks are in `state`, with `TrainPipe`). A mapping of sources
is a mixture, built in `mix` from one `TrainReader` per source.
"""

from __future__ import annotations

import logging
import os
import zlib
from collections.abc import Mapping, Sequence

import numpy as np
from torchdata.nodes import BaseNode

from episodepipes.format import sample_key
from episodepipes.index import Episode, EpisodeIndex
from episodepipes.pipes import block_read
from episodepipes.pipes._decode.mapped import ShardFrames, ShardSlice, frame_members
from episodepipes.pipes.chosen import Chosen
from episodepipes.pipes.order.block_order import BlockOrder
from episodepipes.pipes.order.permute import MISMATCH, IndexShuffle, rank_positions, steps_per_epoch
from episodepipes.pipes.order.rank_blocks import RankBlockLayout
from episodepipes.pipes.order.shuffle import FrameTable
from episodepipes.pipes.order.window import Window, damaged_sample, fields_by_step, window_sample
from episodepipes.pipes.plan import Item
from episodepipes.pipes.sample import RawSample
from episodepipes.pipes.stats import Stats
from episodepipes.pipes.train import state as ts
from episodepipes.remote.ahead import ReadAhead
from episodepipes.shardio import open_source
from episodepipes.tarmembers import frame_fields

log = logging.getLogger(__name__)
READ_AHEAD = 4  # batches a remote root's reader fetches ahead of the one it yields
SHUFFLES = ("full", "block", "rank_block")
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

    The state is that cursor, ``{seed, epoch, pos, stop, start, consumed}`` (``start``: the pass's first epoch; a
    restored pass keeps it and ends after this reader's own ``epochs``, `state.pass_span`), plus what it
    depends on: ``world_size``, ``batch_size``, ``global_batch``, ``frames`` and ``plan``
    (`FrameTable.fingerprint`), ``windows`` (key -> [first, last]) and ``rank``. `check_state` refuses a state
    that differs in ``seed``, ``frames``, ``plan`` or ``windows``. ``rank`` may differ (Lightning saves rank 0's
    state and every rank loads it), and so may ``world_size`` and ``batch_size`` at the same ``global_batch``: the
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
        self.index, self.episodes, self.windows = index, Chosen.of(index, episodes), dict(windows)  # no object each
        self.seed, self.rank, self.world_size, self.batch_size, self.epochs = seed, rank, world_size, batch_size, epochs
        self.stats = stats if stats is not None else Stats()
        self.table = FrameTable(self.episodes.ids, self.episodes.lengths)
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
        # (epoch, its order): a rank-sharded order saved at other sizes, finished on them (`reset`)
        self._carry: tuple[int, BlockOrder] | None = None
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
        self._prefixes: dict[int, tuple[str, bytes]] = {}  # episode position -> (id, member prefix): `_plain_sample`
        self._mapped: ShardFrames | None = None  # a local root's frames, read whole (`_shards`)
        self._starts = np.asarray(self.table.starts, np.int64)  # each episode's first flat frame
        self._row_starts = self.episodes.firsts  # its first index row

    def _order(self, epoch: int) -> IndexShuffle | BlockOrder:
        """Epoch ``epoch``'s order of the frames (pure of the cursor: the read-ahead threads call it too)."""
        if self.blocks is None:
            return IndexShuffle.of(len(self.table), seed=self.seed, epoch=epoch)
        if self._carry is not None and self._carry[0] == epoch:
            return self._carry[1]
        got = self._orders.get(epoch)
        if got is None:
            got = self.blocks.order(seed=self.seed, epoch=epoch)
            self._orders = {**{k: v for k, v in self._orders.items() if epoch - 1 <= k <= epoch + 1}, epoch: got}
        return got

    @property
    def _size(self) -> int:
        return len(self.table)

    def reset(self, initial_state: dict | None = None) -> None:
        """`EpochCursor.reset`; a rank-sharded block order saved mid-epoch at other sizes finishes that epoch on
        the saved order (the global stream's positions are its frames, read through this reader's ranks: exact,
        less local), and the next epoch deals this reader's shares."""
        super().reset(initial_state)
        saved = None if initial_state is None else initial_state.get(ts.SHUFFLE)
        sizes = ts.carried_sizes(saved, self._setup.get(ts.SHUFFLE))
        if sizes is not None and self._pos > 0 and self._epoch == initial_state[ts.EPOCH]:  # type: ignore[index]
            layout = RankBlockLayout.ranked(self.blocks, world_size=sizes[0], batch_size=sizes[1])  # type: ignore[arg-type]
            self._carry = (self._epoch, layout.order(seed=self.seed, epoch=self._epoch))
            self._shuffle = self._batch = None
        elif self._carry is not None and self._carry[0] != self._epoch:
            self._carry = None

    def state_at(self, cursor: tuple[int, int, int | None]) -> dict:
        """`EpochCursor.state_at`; in a carried epoch (`reset`) the state names the order it is read on."""
        state = super().state_at(cursor)
        if self._carry is not None and cursor[0] == self._carry[0]:
            state[ts.SHUFFLE] = self._carry[1].layout.describe()
        return state

    def _carried(self, epoch: int) -> bool:
        return self._carry is not None and self._carry[0] == epoch

    def next(self) -> RawSample:
        if self._stop is not None and self._epoch >= self._stop:
            raise StopIteration
        step, i = divmod(self._pos, self.batch_size)
        flat = int(self._frames_of(self._epoch, step)[i])
        key = (self._epoch, step) if self._batch_windows is None else (self._epoch, int(self._step_windows[i]))
        ahead = None if self._carried(self._epoch) else self._ahead  # its windows are other ranks': read here
        raw = self.sample(flat, None if ahead is None else ahead.get(key).get(flat))
        self._pos += 1
        if self._pos == self.per_epoch:
            self._epoch, self._pos = self._epoch + 1, 0
        return raw

    def close(self) -> None:
        """Close shard files; they are reopened on demand."""
        if not self.index.remote:
            self.source.close()
            self._mapped = None
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
            self._batch_windows = order.window_of(at) if isinstance(order, BlockOrder) and self._ahead \
                and not self._carried(epoch) else None
        if self._batch_windows is not None:
            self._step_windows = self._batch_windows[step - got[1]]
        return got[2][step - got[1]]

    def sample(self, flat: int, got: dict[int, bytes] | None = None) -> RawSample:
        """The sample of flat frame ``flat`` (of `table`), read now, apart from the cursor: how `next` reads, and
        how the mixture's `MixReader` reads a source's frames in its own order.

        Args:
            flat: the frame's number in this reader's `FrameTable`.
            got: the frame bytes a remote read-ahead fetched for it (frame -> bytes); None: read them here.
        """
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

    def _shards(self) -> ShardFrames:
        """The local root's frame reads (one checked ``pread`` a frame: `_mapped` says why not a mapping)."""
        if self._mapped is None:
            self._mapped = ShardFrames(self.source)
        return self._mapped

    def _plain_sample(self, e: int, t: int, shard: int, start: int, end: int, crc: int | None) -> RawSample | None:
        """`sample` of a frame without windows of a local shard whose members `frame_members` parses (the
        usual case), with none of the window bookkeeping; None for anything else, which `sample` then reads."""
        view = self._shards().frame(self._names[shard], start, end)
        known = self._prefixes.get(e)
        if known is None:
            eid = self.episodes[e].id
            known = self._prefixes[e] = (eid, eid.encode() + b"/")
        eid, prefix = known
        got = frame_members(view, prefix + b"%06d." % t)  # sample_key's bytes
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
        return RawSample(Item(eid, t), self._names[shard], members,  # type: ignore[arg-type]
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
        shard, a, b = self.index.frame_ranges(rows, self.episodes.numbers_of(es))  # their episodes' rows only
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
        return self._fetch_flats(self._order(epoch)(at))

    def _fetch_steps(self, es: list[int], ts: list[int]) -> list[Sequence[int]]:
        """The steps whose whole frames the sample of step ``ts[i]`` of episode position ``es[i]`` reads, for each
        ``i``: its own and its windows' (`PackedTrainReader`'s add the records back to each camera's key frame)."""
        return [(t, *fields_by_step(t, self.episodes[e].length, self.windows)) for e, t in zip(es, ts)]

    def _fetch_flats(self, flats: np.ndarray) -> dict[int, dict[int, bytes]]:
        """flat -> step -> bytes of every frame the samples of ``flats`` read (`_fetch_steps`).

        Their byte ranges are looked up together (`block_read.frame_ranges`: on a remote root one round of
        column-block GETs, not a round trip per frame), a frame two samples share is read once, and a shard's
        touching frames are one range (all shards' in one `read_many`, which coalesces near ones further).
        """
        flats = np.asarray(flats, np.int64).ravel()
        es = np.searchsorted(self._starts, flats, side="right") - 1
        ts_ = flats - self._starts[es]
        steps = self._fetch_steps(es.tolist(), ts_.tolist())
        need = list(dict.fromkeys((e, s) for e, ss in zip(es.tolist(), steps) for s in ss))
        got = block_read.read_frames(self.source, self._names, self.episodes, need)
        return {flat: {s: got[e, s] for s in ss} for flat, e, ss in zip(flats.tolist(), es.tolist(), steps)}

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
                                      self.blocks, order(at), steps_of=self._fetch_steps)  # type: ignore[arg-type]

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
        if fetched is None and not self.index.remote:  # the frame in one read, its members parsed in place
            prefix = sample_key(ep.id, step).encode() + b"."
            if not whole:  # arrays only: their members alone are read (no crc32 to check: see above)
                some = self._shards().members(name, start, end, prefix, want)  # type: ignore[arg-type]
                if some is not None:
                    return self._some_fields(step, *some, path, into)
            else:
                view = self._shards().frame(name, start, end)
                got = frame_members(view, prefix, want if crc is None else None)
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
        """`_read` of a frame of a local shard whose members `frame_members` parsed: slices of its bytes, or
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

    def _some_fields(self, step: int, got: dict[str, tuple[int, bytes]], n: int, path: str,
                     into: dict[int, dict[str, bytes]]) -> None:
        """`_read` of a step's array members alone (`ShardFrames.members`): their bytes, or `ShardSlice` references
        to them where decode processes read the frames (`send_slices`)."""
        self.stats.add("bytes_read", n)
        if self._slices:
            into[step] = {f: ShardSlice(path, a, len(b)) for f, (a, b) in got.items()}  # type: ignore[misc]
        else:
            into[step] = {f: b for f, (_, b) in got.items()}
        return None

    def send_slices(self) -> None:
        """Hand frames of local shards out as `ShardSlice` references, which a decode process resolves against
        a read of its own (`Decoder` asks this of its source for ``method="process"``): no frame
        bytes are copied or pickled. Frames read otherwise (a remote root, a member layout the fast path does
        not parse) still come as bytes."""
        self._slices = True
