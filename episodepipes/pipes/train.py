"""`train_pipe`: shuffled training frames with history/horizon windows, even over ranks, exactly resumable.

Graph: `TrainReader` (planned permutation, read by seeking through the byte-range index) -> `Decoder`
(its `SampleDecode` runs the transform in the workers too) -> `BatchStacker`.
The graph persists across passes: a new ``iter()`` continues with the next epoch, as Lightning expects
of a train loader it iterates once per epoch. The resume state is a cursor ``{seed, epoch, pos, stop}`` and
the settings it is valid under, which ``load_state_dict`` checks (`TrainReader`).
"""

from __future__ import annotations

import logging
import os
import pickle
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from torchdata.nodes import BaseNode
from torchdata.nodes.loader import LoaderIterator

from episodepipes.index import Episode, EpisodeIndex
from episodepipes.pipes.batch import BatchStacker
from episodepipes.pipes.builders import check_batchable, dist_rank_world, open_index
from episodepipes.pipes.decode import Decoder
from episodepipes.pipes.options import DecodeOptions
from episodepipes.pipes.pipe import Pipe
from episodepipes.pipes.plan import Item
from episodepipes.pipes.sample import RawSample
from episodepipes.pipes.shuffle import FrameTable, batches_per_epoch, rank_order
from episodepipes.pipes.stats import Stats
from episodepipes.pipes.window import Window, damaged_sample, fields_by_step, plan_windows, window_sample
from episodepipes.shardio import open_source
from episodepipes.tarmembers import frame_fields

log = logging.getLogger(__name__)


class TrainReader(BaseNode[RawSample]):
    """Yield this rank's window samples, epoch after epoch, in the seeded order of `rank_order`.

    A pass runs ``epochs`` epochs (forever when None). ``reset(None)`` starts a new pass at the first
    epoch not yet begun; a restored state continues its pass, and one saved at the end of a pass is
    exhausted (torchdata's contract: the `Loader` then starts the next pass).

    The state is a cursor, ``{seed, epoch, pos, stop}``, plus what the cursor depends on: ``world_size``,
    ``batch_size``, ``frames`` and ``plan`` (`FrameTable.fingerprint`), ``windows`` (key -> [first, last])
    and ``rank``. `check_state` refuses a state that differs in any of them but ``rank``: every rank is at
    the same ``pos`` (Lightning saves rank 0's state and every rank loads it). ``pos`` samples on each of
    ``world_size`` ranks are the first ``pos * world_size`` entries of the epoch's permutation.
    """

    SEED_KEY, EPOCH_KEY, POS_KEY, STOP_KEY = "seed", "epoch", "pos", "stop"
    WORLD_KEY, RANK_KEY, BATCH_KEY = "world_size", "rank", "batch_size"
    FRAMES_KEY, PLAN_KEY, WINDOWS_KEY = "frames", "plan", "windows"

    def __init__(self, index: EpisodeIndex, episodes: Sequence[Episode], *, windows: Mapping[str, Window], seed: int,
                 rank: int, world_size: int, batch_size: int, epochs: int | None, stats: Stats | None = None) -> None:
        super().__init__()
        self.index, self.episodes, self.windows = index, list(episodes), dict(windows)
        self.seed, self.rank, self.world_size, self.batch_size, self.epochs = seed, rank, world_size, batch_size, epochs
        self.stats = stats if stats is not None else Stats()
        self.table = FrameTable([e.id for e in self.episodes], [e.length for e in self.episodes])
        self.per_epoch = batches_per_epoch(len(self.table), world_size=world_size, batch_size=batch_size) * batch_size
        if self.per_epoch == 0:
            raise ValueError(f"{len(self.table)} frames make no full batch of batch_size={batch_size} on each of "
                             f"world_size={world_size} ranks; lower batch_size")
        self._setup = {self.WORLD_KEY: world_size, self.RANK_KEY: rank, self.BATCH_KEY: batch_size,
                       self.FRAMES_KEY: len(self.table), self.PLAN_KEY: self.table.fingerprint(),
                       self.WINDOWS_KEY: {k: [w.first, w.last] for k, w in sorted(self.windows.items())}}
        self._epoch = self._pos = 0
        self._stop: int | None = None
        self._order: tuple[int, np.ndarray] | None = None  # (epoch, its order): recomputed, never saved
        self.source = open_source(index.root)  # its descriptors are closed in close(), reopened on demand
        self._names = [s.name for s in index.shards]
        self._where = [os.path.join(str(self.source.root), n) for n in self._names]  # for messages

    def reset(self, initial_state: dict | None = None) -> None:
        super().reset(initial_state)
        self.close()
        stop: int | None = None
        if initial_state is None:
            epoch, pos = self._epoch + (self._pos > 0), 0
        else:
            self.check_state(initial_state)
            epoch, pos, stop = (initial_state[k] for k in (self.EPOCH_KEY, self.POS_KEY, self.STOP_KEY))
        self._epoch, self._pos = int(epoch), int(pos)
        self._stop = None if self.epochs is None else (self._epoch + self.epochs if stop is None else int(stop))

    def check_state(self, state: Mapping[str, Any]) -> None:
        """Refuse a saved state this reader cannot continue exactly, saying what differs and what to do."""
        if not isinstance(state, Mapping):
            raise ValueError(f"the saved train state is a {type(state).__name__}, not a dict; pass the pipe's own "
                             "state_dict()")
        missing = [k for k in (self.SEED_KEY, self.EPOCH_KEY, self.POS_KEY, self.STOP_KEY, *self._setup)
                   if k not in state]
        if missing:
            raise ValueError(f"the saved train state has no {missing} (saved by an older episodepipes?), so it "
                             "cannot be checked against this pipe; resume with the version that saved it, or start "
                             "the run afresh")
        diffs = state_mismatch(state, {self.SEED_KEY: self.seed, **self._setup})
        if diffs:
            raise ValueError(f"the saved train state does not fit this pipe: {'; '.join(d for d, _ in diffs)}. "
                             f"{' '.join(dict.fromkeys(f for _, f in diffs))}")
        epoch, pos, stop = (state[k] for k in (self.EPOCH_KEY, self.POS_KEY, self.STOP_KEY))
        if not all(_count(v) for v in (epoch, pos)) or not (stop is None or _count(stop)):
            raise ValueError(f"the saved train state has epoch={epoch!r}, pos={pos!r}, stop={stop!r}: not "
                             "non-negative ints; pass the pipe's own state_dict()")
        if not pos < self.per_epoch:
            raise ValueError(f"the saved state is at sample {pos} of an epoch, but this pipe has {self.per_epoch} "
                             "per epoch and rank; resume with the checkpoint's batch_size and world_size")

    def next(self) -> RawSample:
        if self._stop is not None and self._epoch >= self._stop:
            raise StopIteration
        raw = self._sample(int(self._order_of(self._epoch)[self._pos]))
        self._pos += 1
        if self._pos == self.per_epoch:
            self._epoch, self._pos = self._epoch + 1, 0
        return raw

    def get_state(self) -> dict[str, Any]:
        # called before every sample read (Decoder): one flat dict; the windows dict is shared, never changed
        return {self.SEED_KEY: self.seed, self.EPOCH_KEY: self._epoch, self.POS_KEY: self._pos,
                self.STOP_KEY: self._stop, **self._setup}

    def close(self) -> None:
        """Close shard files; they are reopened on demand."""
        self.source.close()

    def _order_of(self, epoch: int) -> np.ndarray:
        if self._order is None or self._order[0] != epoch:
            self._order = (epoch, rank_order(len(self.table), seed=self.seed, epoch=epoch, rank=self.rank,
                                             world_size=self.world_size, batch_size=self.batch_size))
        return self._order[1]

    def _sample(self, flat: int) -> RawSample:
        e, t = self.table.locate(flat)
        ep = self.episodes[e]
        read: dict[int, dict[str, bytes]] = {}
        damaged = [why for s, want in ((t, None), *fields_by_step(t, ep.length, self.windows).items())
                   if (why := self._read(ep, s, want, read)) is not None]
        self.stats.add("frames_read", len(read))
        item = Item(ep.id, t)
        shard = self.index.shards[ep.frame_range(t)[0]].name
        if damaged:  # nothing of it is decoded: the Decoder gives zeros and counts it corrupt
            return damaged_sample(item, shard, ep.length, self.windows, damaged[0])
        return window_sample(item, shard, ep.length, self.windows, read)

    def _read(self, ep: Episode, step: int, want: set[str] | None, into: dict[int, dict[str, bytes]]) -> str | None:
        """Read ``step``'s fields into ``into[step]``; why its bytes are damaged, or None.

        A frame read whole (the current step, and window steps of a camera) is checked against its crc32 in
        the index; a step read only for arrays is not (checking it would mean reading the JPEGs beside them).
        """
        shard, start, end = ep.frame_range(step)
        name, path, read = self._names[shard], self._where[shard], self.source.read
        crc = ep.frame_crc(step) if want is None or any(f.endswith(".jpg") for f in want) else None
        reads: list[bytes] = []

        def pread(size: int, offset: int) -> bytes:
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
        if crc is not None and zlib.crc32(reads[0]) != crc:
            return f"frame {step} does not match its crc32 in the index"
        return None


def _count(v: Any) -> bool:
    return isinstance(v, int | np.integer) and not isinstance(v, bool) and v >= 0


_FIXES = {
    "seed": "Build the pipe with the checkpoint's seed.",
    "world_size": "Resume with the checkpoint's world_size and batch_size: resuming under another world size or "
                  "batch size (elastic resume) is not supported yet.",
    "frames": "Resume on the index and split the checkpoint was trained on (same episodes and lengths).",
    "windows": "Build the pipe with the checkpoint's history and horizon.",
}
_FIXES.update(batch_size=_FIXES["world_size"], plan=_FIXES["frames"])


def state_mismatch(saved: Mapping[str, Any], mine: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(what differs, its fix) for each setting in ``mine`` that ``saved`` has otherwise; ``rank`` may differ."""
    out = []
    for key, want in mine.items():
        got = saved[key]
        if key == TrainReader.WINDOWS_KEY:  # a state saved as JSON has lists where this one may have tuples
            try:
                same = {k: list(v) for k, v in got.items()} == want
            except (AttributeError, TypeError):
                same = False
        else:
            same = key == TrainReader.RANK_KEY or got == want
        if not same:
            out.append((f"{key}={got!r} in the state, {want!r} here", _FIXES[key]))
    return out


class TrainPipe(Pipe):
    """A `Pipe` whose ``len()`` is ``epochs * batches_per_epoch``; in infinite mode ``len()`` raises TypeError.

    ``load_state_dict`` checks the state against the pipe at once (`TrainReader.check_state`), not at the
    next ``iter()``; a state saved at the end of a pass makes that ``iter()`` the next pass.
    """

    def __init__(self, root: BatchStacker, *, length: int | None, index: EpisodeIndex, stats: Stats,
                 reader: TrainReader, rank_world: tuple[int, int] | None = None) -> None:
        # restart: the reader restored at the end of a pass is exhausted, and the Loader then starts the next one
        super().__init__(root, length=length or 0, index=index, stats=stats, gated=False, rank_world=rank_world,
                         restart=True)
        self.infinite = length is None
        self.reader = reader

    def __len__(self) -> int:
        if self.infinite:
            raise TypeError("train_pipe(epochs=None) is infinite and has no len(); pass epochs=N for a length, "
                            "or bound training by steps (Lightning's max_steps)")
        return super().__len__()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        try:
            saved = state[LoaderIterator.ROOT_KEY][BatchStacker.SOURCE_KEY][Decoder.SOURCE_KEY]
        except (KeyError, TypeError, IndexError):
            raise ValueError("the state passed to load_state_dict is not a train_pipe's state_dict(); pass the "
                             "one the pipe (or the Lightning checkpoint) saved") from None
        self.reader.check_state(saved)
        super().load_state_dict(state)


def train_pipe(index: EpisodeIndex | str | os.PathLike, *, split: str = "train", batch_size: int, seed: int,
               history: Mapping[str, int] | None = None, horizon: Mapping[str, int] | None = None,
               rank: int | None = None, world_size: int | None = None, num_workers: int = 2, method: str = "thread",
               transform: Callable[[dict[str, Any]], dict[str, Any]] | None = None, epochs: int | None = 1,
               resize: tuple[int, int] | None = None, on_corrupt: str = "skip") -> TrainPipe:
    """Shuffled frames of ``split``: ``epochs`` epochs per ``iter()``, the same whole number of batches per rank.

    Order: epoch ``e`` is a permutation of every frame drawn from ``SeedSequence(seed, spawn_key=(e,))``;
    rank ``r`` takes every ``world_size``-th entry from ``r``, trimmed to ``len(pipe) // epochs`` full
    batches (drop-last: at most ``world_size * batch_size - 1`` frames sit out an epoch, different ones
    each epoch). Each ``iter()`` continues with the next epochs; ``epochs=None`` is one endless pass.

    Windows (see `episodepipes.pipes.window`): ``history={"state": K}`` gives steps ``t-K+1..t`` (the
    current step last), ``horizon={"action": H}`` gives ``t..t+H-1`` (the current step first), both
    padded at episode edges with the nearest real step and marked in ``<key>_pad``. Only the returned
    steps' members are read and decoded.

    Every episode of the split must have the same cameras, and arrays of the same keys, dtypes and shapes:
    a mismatch is refused when the pipe is built, naming both episodes and the key (nothing is cast).
    Frames read whole (each sample's current step, and the steps of camera windows) are checked against
    the index's crc32; a mismatch makes the sample corrupt, as a JPEG that does not decode (``on_corrupt``).

    ``transform(sample) -> sample`` runs per sample in the decode workers, before collation (so it must
    pickle for ``method="process"``); ``episode``, ``frame``, ``timestamp``, ``valid`` and ``prompt``
    are restored after it. ``state_dict()``/``load_state_dict()`` resume exactly, in any step, a pipe
    built with the same ``seed``, ``batch_size``, ``world_size``, windows and episodes; ``load_state_dict``
    refuses a state saved under others, saying what differs (another rank's state is accepted: every rank
    is at the same position).
    """
    options = DecodeOptions(num_workers=num_workers, method=method, resize=resize, on_corrupt=on_corrupt)
    idx = open_index(index)
    inferred = rank is None or world_size is None  # then iter() checks them against torch.distributed's
    rank, world_size = dist_rank_world(rank, world_size)
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise ValueError(f"seed={seed!r} should be a non-negative int (it fixes every epoch's order)")
    if epochs is not None and (isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1):
        raise ValueError(f"epochs={epochs!r} should be a positive int, or None for an endless (step-based) pass")
    if transform is not None and not callable(transform):
        raise TypeError(f"transform={transform!r} should be a callable taking and returning a sample dict")
    episodes = idx.split(split)
    if not episodes:
        raise ValueError(f"split={split!r} has no episodes in {idx.root}; splits there: "
                         f"{sorted({e.split for e in idx.episodes})}")
    check_batchable(episodes, resize)  # so episode 0's array specs are every episode's
    video = sorted({c for e in episodes for c, cam in e.cameras.items() if cam.codec != "jpeg"})
    if video:
        raise ValueError(f"train_pipe reads JPEG shards; video-codec cameras come next: cameras {video} of "
                         f"{idx.root} are h264/av1; re-shard with --codec jpeg to train on them today")
    windows = plan_windows(history, horizon, cameras=set(episodes[0].cameras), arrays=set(episodes[0].arrays))
    stats = Stats()
    reader = TrainReader(idx, episodes, windows=windows, seed=int(seed), rank=rank, world_size=world_size,
                         batch_size=batch_size, epochs=epochs, stats=stats)
    if method == "process" and transform is not None:
        try:
            pickle.dumps(transform)
        except Exception as e:
            raise TypeError(f"transform={transform!r} does not pickle ({e}); with method='process' use a "
                            "module-level function or a picklable callable object, or method='thread'") from None
    dec = Decoder(reader, idx, options, stats=stats, transform=transform)
    per = reader.per_epoch // batch_size
    log.debug("train_pipe: %d frames, %d batches per epoch on rank %d of %d", len(reader.table), per, rank,
              world_size)
    return TrainPipe(BatchStacker(dec, batch_size=batch_size, stats=stats),
                     length=None if epochs is None else epochs * per, index=idx, stats=stats, reader=reader,
                     rank_world=(rank, world_size) if inferred else None)
