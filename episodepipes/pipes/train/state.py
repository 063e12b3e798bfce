"""The checks a saved train state passes before a train reader continues it, and where it continues.

A train reader's state is a cursor ``{seed, epoch, pos, stop, start, consumed}`` plus its setup: the settings the
cursor is valid under (world size, batch size, their product the global batch, frame count, plan
fingerprint, windows; a mixture adds its sources, weights and stop rule; the block order adds ``shuffle``, its
layout, and a state without it is the full shuffle's). `resume_at` refuses a state
that is malformed or saved under another setup, by name and with the fix, and turns one saved at another
world size (same global batch) into this rank's cursor (`permute.resume_point`). The pipe it is loaded into
decides where the pass ends (`pass_span`): its own ``epochs`` after the saved pass's ``start``, so a run can be
extended, and ``len()`` and what the pass yields agree; a position past that end is refused.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np
from torchdata.nodes import BaseNode
from torchdata.nodes.loader import LoaderIterator

from episodepipes.index import EpisodeIndex
from episodepipes.pipes.batch import BatchStacker
from episodepipes.pipes.decode import Decoder
from episodepipes.pipes.order.permute import resume_point, steps_per_epoch
from episodepipes.pipes.pipe import Pipe
from episodepipes.pipes.stats import Stats

log = logging.getLogger(__name__)

SEED, EPOCH, POS, STOP, START = "seed", "epoch", "pos", "stop", "start"  # START: the pass's first epoch
WORLD, RANK, BATCH = "world_size", "rank", "batch_size"
FRAMES, PLAN, WINDOWS = "frames", "plan", "windows"
CONSUMED, GLOBAL = "consumed", "global_batch"
SOURCES, WEIGHTS, STOP_RULE = "sources", "weights", "stop_rule"  # a mixture's
SHUFFLE, FULL = "shuffle", "full"  # the block order's layout; a state without it is the full shuffle's

FIXES = {
    SEED: "Build the pipe with the checkpoint's seed.",
    GLOBAL: "Resume with world_size*batch_size equal to the checkpoint's global_batch (any world size "
            "and batch size with that product continue its stream exactly), or build the pipe with "
            "on_resize='next_step' or 'next_epoch' to skip ahead to a step of the new size.",
    FRAMES: "Resume on the index and split the checkpoint was trained on (same episodes and lengths).",
    WINDOWS: "Build the pipe with the checkpoint's history and horizon.",
    SOURCES: "Build the mixture with the checkpoint's sources (the same names, in the same order).",
    WEIGHTS: "Build the mixture with the checkpoint's weights (they fix which source each sample comes from).",
    STOP_RULE: "Build the mixture with the checkpoint's stop= rule.",
    SHUFFLE: "Build the pipe with the checkpoint's shuffle=, block_frames= and window_blocks=, on the shards it "
             "was trained on (the block order follows the shard layout).",
}
FIXES[PLAN] = FIXES[FRAMES]
_ELASTIC = (RANK, WORLD, BATCH)  # may differ: resume_at checks them against the global batch
LIMIT = 1 << 63  # a cursor count at or above it was not saved by a pipe (nothing runs 2**63 epochs)


def count(v: Any) -> bool:
    """Whether ``v`` is a non-negative int below `LIMIT` (numpy ints too; bools and floats not)."""
    return isinstance(v, int | np.integer) and not isinstance(v, bool) and 0 <= v < LIMIT


def _same(key: str, got: Any, want: Any) -> bool:
    return key in _ELASTIC or _equal(got, want)


def _equal(got: Any, want: Any) -> bool:
    """``got == want`` with the types a state holds: an int only equals an int (``4.0`` and ``True`` are not a
    seed of 4), a string a string; dicts and lists compare item by item (a state saved as JSON has lists where
    this one may have tuples)."""
    if isinstance(want, int | np.integer) and not isinstance(want, bool):
        return isinstance(got, int | np.integer) and not isinstance(got, bool) and got == want
    if isinstance(want, Mapping):
        return (isinstance(got, Mapping) and set(got) == set(want)
                and all(_equal(got[k], v) for k, v in want.items()))
    if isinstance(want, list | tuple):
        return isinstance(got, list | tuple) and len(got) == len(want) and all(map(_equal, got, want))
    return type(got) is type(want) and bool(got == want)


def carried_sizes(saved: Any, mine: Any) -> tuple[int, int] | None:
    """``(world_size, batch_size)`` of a saved rank-sharded block order (``shuffle="rank_block"``) that differs
    from this reader's in those sizes alone, else None. Its shares follow the sizes, so a reader of other sizes
    finishes the saved epoch on the saved order (`TrainReader.reset`), whose positions are every frame once (its
    shares' undealt tails last): at the same global batch the stream stays exact, only less local; at another, its
    positions are read at the new global batch as the block order's are (`permute.resume_point`)."""
    if not (isinstance(saved, Mapping) and isinstance(mine, Mapping) and saved.get(SHUFFLE) == "rank_block"
            and mine.get(SHUFFLE) == "rank_block" and set(saved) == set(mine)):
        return None
    sizes = (saved.get(WORLD), saved.get(BATCH))
    if not all(count(v) and v for v in sizes) or sizes == (mine[WORLD], mine[BATCH]):
        return None
    rest = (WORLD, BATCH)
    if any(not _equal(saved[k], v) for k, v in mine.items() if k not in rest):
        return None
    return int(sizes[0]), int(sizes[1])


def state_mismatch(saved: Mapping[str, Any], mine: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(what differs, its fix) for each setting in ``mine`` that ``saved`` has otherwise; ``rank``,
    ``world_size`` and ``batch_size`` may differ (elastic resume: ``global_batch`` decides)."""
    out = []
    for key, want in mine.items():
        got = saved[key]
        if _same(key, got, want):
            continue
        if key == GLOBAL:
            sizes = [f"(world_size={d.get(WORLD)!r} x batch_size={d.get(BATCH)!r})" for d in (saved, mine)]
            out.append((f"{key}={got!r} {sizes[0]} in the state, {want!r} {sizes[1]} here", FIXES[key]))
        else:
            out.append((f"{key}={got!r} in the state, {want!r} here", FIXES[key]))
    return out


def pass_span(state: Mapping[str, Any], *, epochs: int | None, epoch: int, pos: int,
              note: bool = False) -> tuple[int, int | None]:
    """``(start, stop)`` of the pass a reader of ``epochs`` epochs per pass continues ``state`` in, at ``(epoch, pos)``.

    The pass keeps its first epoch (``start``) and ends after this reader's ``epochs`` (the saved ``stop`` was
    the saving pipe's), so ``len()`` minus the batches already done is what the pass still yields, and a run
    saved at ``epochs=2`` finishes 5 in a pipe of ``epochs=5``. A position this pass does not hold is refused.
    ``note`` logs a changed end (once, when the state is taken, not when it is checked).
    """
    stop = state[STOP]
    if START not in state:  # saved before states carried it: its pass had this pipe's epochs, or it is refused
        start = epoch if stop is None or epochs is None else stop - epochs
        if not 0 <= start <= epoch:
            raise ValueError(f"the saved train state has stop={stop!r} and no start (saved by an older "
                             f"episodepipes), and with this pipe's epochs={epochs} its pass would begin at epoch "
                             f"{start}, which does not hold its epoch={epoch}; build the pipe with the epochs= the "
                             "checkpoint was saved with")
    else:
        start = state[START]
    if not count(start) or start > epoch:
        raise ValueError(f"the saved train state has start={start!r}, epoch={epoch!r}: start, the pass's first "
                         "epoch, should be an int in [0, epoch]; pass the pipe's own state_dict()")
    if stop is not None and not (start < stop and (epoch < stop or (epoch == stop and pos == 0))):
        raise ValueError(f"the saved train state has stop={stop!r} with start={start}, epoch={epoch}, pos={pos}: a "
                         "pass stops after its start, and its epoch reaches stop only at pos=0 (the pass's end); "
                         "pass the pipe's own state_dict()")
    if epochs is None:
        return int(start), None
    end = int(start) + epochs
    if epoch > end or (epoch == end and pos):
        raise ValueError(f"the saved train state is at epoch={epoch}, pos={pos} of a pass from epoch start={start}, "
                         f"past the end of this pipe's pass (epochs={epochs}: epochs {start} to {end - 1}); build "
                         f"the pipe with epochs >= {epoch - start + (pos > 0)} to finish that pass, or start the "
                         "run afresh")
    if note and stop is not None and stop != end:
        log.info("resuming a pass of epochs %d to %d saved with epochs=%d: with epochs=%d it ends before epoch %d",
                 start, stop - 1, stop - start, epochs, end)
    return int(start), end


def resume_at(state: Mapping[str, Any], *, seed: int, setup: Mapping[str, Any], n: int, world_size: int,
              batch_size: int, epochs: int | None, on_resize: str, skip: bool) -> tuple[int, int, int]:
    """``(epoch, pos, start)`` where a reader of ``setup`` continues ``state``, and its pass's first epoch
    (`pass_span`), after checking it.

    Args:
        state: the saved reader state (from any checkpoint file: validated here).
        seed: this reader's seed.
        setup: this reader's settings (the keys its state carries besides the cursor).
        n: samples per epoch in this reader's global stream.
        world_size, batch_size: this reader's size.
        epochs: this reader's epochs per pass (None: endless); it decides where the pass ends.
        on_resize: ``"refuse"``, ``"next_step"`` or ``"next_epoch"`` (another global batch).
        skip: take (and log) a skip ``on_resize`` allows; False only checks (``check_state``).
    """
    if not isinstance(state, Mapping):
        raise ValueError(f"the saved train state is a {type(state).__name__}, not a dict; pass the pipe's own "
                         "state_dict()")
    missing = [k for k in (SEED, EPOCH, POS, STOP, CONSUMED, *setup) if k not in state and k != SHUFFLE]
    if missing:
        raise ValueError(f"the saved train state has no {missing} (saved by an older episodepipes, or by a pipe "
                         "of one source where this is a mixture or the other way round?), so it cannot be "
                         "checked against this pipe; resume with the pipe that saved it, or start the run afresh")
    epoch, pos, stop, world, batch, consumed, g, rank = (state[k] for k in (EPOCH, POS, STOP, WORLD, BATCH, CONSUMED,
                                                                            GLOBAL, RANK))
    if not all(count(v) for v in (epoch, pos, consumed)) or not (stop is None or count(stop)):
        raise ValueError(f"the saved train state has epoch={epoch!r}, pos={pos!r}, stop={stop!r}, "
                         f"consumed={consumed!r}: not non-negative ints; pass the pipe's own state_dict()")
    if not (count(world) and count(batch) and count(g) and world and batch and g == world * batch
            and consumed == pos * world and pos < steps_per_epoch(n, world_size=world, batch_size=batch) * batch):
        raise ValueError(f"the saved train state has world_size={world!r}, batch_size={batch!r}, "
                         f"global_batch={g!r}, pos={pos!r}, consumed={consumed!r}: global_batch should be "
                         "world_size*batch_size, consumed pos*world_size, and pos within the epoch's "
                         f"{n} frames; pass the pipe's own state_dict()")
    if not (count(rank) and rank < world):
        raise ValueError(f"the saved train state has rank={rank!r}, not a rank of its world_size={world}; pass the "
                         "pipe's own state_dict()")
    mine = {SEED: seed, **setup, SHUFFLE: setup.get(SHUFFLE, FULL)}
    state = {**state, SHUFFLE: state.get(SHUFFLE, FULL)}
    carried = carried_sizes(state[SHUFFLE], mine[SHUFFLE])
    if carried is not None:  # a rank-sharded order of other sizes: its epoch is finished on it (`TrainReader`)
        if carried[0] * carried[1] > n or carried[0] > 1 << 31:  # a pipe that deals no full step is never built
            raise ValueError(f"the saved train state's shuffle='rank_block' order has world_size={carried[0]} x "
                             f"batch_size={carried[1]}, more than the epoch's {n} frames: no pipe deals it; pass "
                             "the pipe's own state_dict()")
        state = {**state, SHUFFLE: mine[SHUFFLE]}
    if on_resize != "refuse":  # another global batch is allowed: resume_point skips ahead, logged
        del mine[GLOBAL]
    diffs = state_mismatch(state, mine)
    if diffs:
        raise ValueError(f"the saved train state does not fit this pipe: {'; '.join(d for d, _ in diffs)}. "
                         f"{' '.join(dict.fromkeys(f for _, f in diffs))}")
    start, _ = pass_span(state, epochs=epochs, epoch=epoch, pos=pos, note=skip)
    if (world, batch) == (world_size, batch_size):
        return int(epoch), int(pos), start
    if pos % batch:
        raise ValueError(f"the saved train state is inside a batch (pos={pos}, batch_size={batch}), and a "
                         f"resume under another size (world_size={world} -> {world_size}, batch_size="
                         f"{batch} -> {batch_size}) starts at a batch boundary; resume with the "
                         "checkpoint's world_size and batch_size, or from a state saved between batches")
    if not skip and on_resize != "refuse":
        return int(epoch), int(pos), start  # not the cursor: reset() computes it (and logs the skip) once
    elastic = {"seed": seed, "epoch": int(epoch), "consumed": int(consumed), "global_batch": int(g), "n": n}
    epoch, step = resume_point(elastic, world_size=world_size, batch_size=batch_size, n=n, seed=seed,
                               on_mismatch=on_resize)
    return epoch, step * batch_size, start  # a skip to the next epoch reaches this pass's stop at most


class EpochCursor:
    """`reset`/`check_state` of a train reader whose cursor is ``(epoch, pos)`` and whose order follows from its
    seed and setup; shared by `TrainReader` and the mixture's reader. ``_size`` is the sample count of an epoch."""

    seed: int
    epochs: int | None
    world_size: int
    batch_size: int
    on_resize: str
    _setup: dict
    _epoch: int
    _pos: int
    _stop: int | None
    _start: int = 0

    @property
    def _size(self) -> int:
        raise NotImplementedError

    def cursor(self) -> tuple[int, int, int | None]:
        """``(epoch, pos, stop)``: what the state depends on that moves; `state_at` makes the state of it. A
        `Decoder` keeps this, not the state dict, for every sample in flight (it asks for one per sample)."""
        return self._epoch, self._pos, self._stop

    def state_at(self, cursor: tuple[int, int, int | None]) -> dict[str, Any]:
        """The state dict of a `cursor` of this reader (``get_state`` is ``state_at(cursor())``)."""
        epoch, pos, stop = cursor
        return {SEED: self.seed, EPOCH: epoch, POS: pos, STOP: stop, START: self._start,
                CONSUMED: pos * self.world_size, **self._setup}

    def get_state(self) -> dict[str, Any]:
        return self.state_at((self._epoch, self._pos, self._stop))

    def reset(self, initial_state: dict | None = None) -> None:
        super().reset(initial_state)  # type: ignore[misc]
        self.close()  # type: ignore[attr-defined]
        if initial_state is None:
            epoch, pos = self._epoch + (self._pos > 0), 0
            start = epoch
        else:
            epoch, pos, start = self._resume_at(initial_state, skip=True)
        self._epoch, self._pos, self._start = int(epoch), int(pos), int(start)
        self._stop = None if self.epochs is None else self._start + self.epochs

    def check_state(self, state: Mapping[str, Any]) -> None:
        """Refuse a saved state this reader cannot continue exactly, saying what differs and what to do."""
        self._resume_at(state, skip=False)

    def _resume_at(self, state: Mapping[str, Any], *, skip: bool) -> tuple[int, int, int]:
        """``(epoch, pos, start)`` where this reader continues ``state``, after `check_state`'s checks; a skip
        ``on_resize`` allows is taken (and logged) only with ``skip``, as `reset` does."""
        return resume_at(state, seed=self.seed, setup=self._setup, n=self._size, world_size=self.world_size,
                         batch_size=self.batch_size, epochs=self.epochs, on_resize=self.on_resize, skip=skip)


class TrainPipe(Pipe):
    """A `Pipe` whose ``len()`` is ``epochs * batches_per_epoch``; in infinite mode ``len()`` raises TypeError.

    ``load_state_dict`` checks the state against the pipe at once (`TrainReader.check_state`), not at the
    next ``iter()``; a state saved at the end of a pass makes that ``iter()`` the next pass.
    """

    def __init__(self, root: BaseNode, *, length: int | None, index: EpisodeIndex, stats: Stats,
                 reader: Any, rank_world: tuple[int, int] | None = None,
                 state_path: tuple[str, ...] = (BatchStacker.SOURCE_KEY, Decoder.SOURCE_KEY)) -> None:
        # restart: the reader restored at the end of a pass is exhausted, and the Loader then starts the next one
        super().__init__(root, length=length or 0, index=index, stats=stats, gated=False, rank_world=rank_world,
                         restart=True)
        self.infinite = length is None
        self.reader = reader  # a TrainReader, or a mixture's MixReader
        self._path = state_path  # where the reader's state sits below the loader's root key

    def __len__(self) -> int:
        if self.infinite:
            raise TypeError("train_pipe(epochs=None) is infinite and has no len(); pass epochs=N for a length, "
                            "or bound training by steps (Lightning's max_steps)")
        return super().__len__()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = state.get(LoaderIterator.ROOT_KEY) if isinstance(state, Mapping) else None
        depth = 0  # the reader's state is some levels of "source" below the root: one more in a mixture
        while isinstance(saved, Mapping) and SEED not in saved and depth <= len(self._path):
            saved, depth = saved.get(Decoder.SOURCE_KEY), depth + 1
        if not isinstance(saved, Mapping) or SEED not in saved:
            raise ValueError("the state passed to load_state_dict is not a train_pipe's state_dict(); pass the "
                             "one the pipe (or the Lightning checkpoint) saved")
        if depth != len(self._path):
            kinds = {2: "a train_pipe of one source", 3: "a mixture"}
            raise ValueError(f"the saved train state is {kinds.get(depth, 'another pipe')}'s and this pipe is "
                             f"{kinds.get(len(self._path), 'another')}; resume with the kind of pipe that saved it")
        self.reader.check_state(saved)
        super().load_state_dict(state)
