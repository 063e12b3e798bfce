"""The nodes of a `train_pipe` mixture: `MixReader` (the interleave over per-source `TrainReader`s), the
`MixIndex` the `Decoder` reads specs from, the `Sourced` transform and `SourceNames` (``batch["source"]``).

Inside the graph a sample's episode is ``"<source>:<id>"`` (and its shard ``"<source>:<shard>"``), so
episodes of the same id in two sources stay apart and messages name the source; the batch gets the plain
ids back, and the transform sees them too (with ``sample["source"]``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from torchdata.nodes import BaseNode

from episodepipes.index import ArraySpec, Camera, Episode, EpisodeIndex
from episodepipes.index.check import VIDEO_CODECS
from episodepipes.pipes._decode.lifecycle import shutdown_node
from episodepipes.pipes.order.mixture import Mixture
from episodepipes.pipes.order.permute import MISMATCH, IndexShuffle, rank_positions, steps_per_epoch
from episodepipes.pipes.order.window import Window
from episodepipes.pipes.plan import Item
from episodepipes.pipes.sample import RawSample
from episodepipes.pipes.train import state as ts
from episodepipes.pipes.train.reader import TrainReader

CAMERA_EXTS = ("jpg", *VIDEO_CODECS)  # a camera member's field: a JPEG, or a video camera's packed GOP
_STEP_STREAM = 1 << 31  # the per-step rank deal's stream tag: no source number reaches it


@dataclass(frozen=True)
class View:
    """An episode as the batch sees it: its cameras and arrays under their batch keys (what `EpisodeSpec.of`
    and `stack_mismatch` read)."""

    id: str
    cameras: dict[str, Camera]
    arrays: dict[str, ArraySpec]
    fps: float
    prompt: str


def view(ep: Episode, keys: Mapping[str, str] | None) -> View:
    """``ep`` under ``keys`` (source key -> batch key; the keys not named are dropped)."""
    if keys is None:
        return View(ep.id, ep.cameras, ep.arrays, ep.fps, ep.prompt)
    return View(ep.id, {keys[c]: v for c, v in ep.cameras.items() if c in keys},
                {keys[a]: v for a, v in ep.arrays.items() if a in keys}, ep.fps, ep.prompt)


class MixIndex:
    """What the `Decoder` asks of an index for a mixture: ``episode(token)`` -> the episode's `View`."""

    def __init__(self, names: Sequence[str], indexes: Sequence[EpisodeIndex],
                 keys: Sequence[Mapping[str, str] | None]) -> None:
        self.by_name = {n: (i, k) for n, i, k in zip(names, indexes, keys)}

    def episode(self, token: str) -> View:
        name, _, eid = token.partition(":")
        index, keys = self.by_name[name]
        return view(index.episode(eid), keys)


@dataclass(frozen=True)
class Sourced:
    """The pipe's transform, run in the workers on a sample with its plain ``episode`` id and ``source`` name
    (``sample["source"]``, as `normalize.PerSource` reads it); picklable when ``transform`` is."""

    transform: Callable[[dict[str, Any]], dict[str, Any]]

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        name, _, eid = str(sample["episode"]).partition(":")
        out = self.transform({**sample, "episode": eid, "source": name})
        if isinstance(out, dict):
            out.pop("source", None)  # the batch gets it as a list (SourceNames), not as a stacked field
        return out


class SourceNames(BaseNode[dict]):
    """Give each batch ``source`` (the source name of each sample) and the samples' plain episode ids."""

    SOURCE_KEY = "source"

    def __init__(self, source: BaseNode[dict]) -> None:
        super().__init__()
        self.source = source

    def reset(self, initial_state: dict | None = None) -> None:
        super().reset(initial_state)
        self.source.reset(initial_state[self.SOURCE_KEY] if initial_state else None)

    def next(self) -> dict:
        batch = next(self.source)
        parts = [str(e).partition(":") for e in batch["episode"]]
        batch["source"] = [s for s, _, _ in parts]
        batch["episode"] = [e for _, _, e in parts]
        return batch

    def get_state(self) -> dict[str, Any]:
        return {self.SOURCE_KEY: self.source.state_dict()}

    def shutdown(self) -> None:
        shutdown_node(self.source)

    close = shutdown


class MixReader(ts.EpochCursor, BaseNode[RawSample]):
    """Yield this rank's samples of a mixture, epoch after epoch: `TrainReader`'s cursor over `Mixture`'s stream.

    Epoch ``e``'s global stream is the interleave (``mixture.samples(g, seed, e)``: which source, and which
    of its frames, each source in its own keyed order per pass). Global step ``s`` is its block
    ``[s*G, (s+1)*G)`` (``G = world_size * batch_size``), so each step holds every source's exact share;
    the block's entries are dealt to the ranks in a keyed order of ``(seed, e, s)`` (a fixed deal would
    give a rank only one source where the interleave alternates), ``batch_size`` each. Both depend on
    ``G`` only: the state (`TrainReader`'s cursor and setup, plus ``sources``, ``weights`` and
    ``stop_rule``; ``frames`` and ``plan`` per source) resumes at another world size of the same ``G``.

    Args:
        names: the source names, in order.
        readers: one `TrainReader` per source (of world size 1: only their sample reads are used).
        keys: per source, ``{source key: batch key}`` or None.
        mixture: the `Mixture` over the readers' frame counts.
        windows: the batch-key windows (for the state).
        seed, rank, world_size, batch_size, epochs, on_resize: as `TrainReader`'s.
    """

    def __init__(self, names: Sequence[str], readers: Sequence[TrainReader], keys: Sequence[Mapping[str, str] | None],
                 mixture: Mixture, *, windows: Mapping[str, Window], seed: int, rank: int, world_size: int,
                 batch_size: int, epochs: int | None, on_resize: str = "refuse") -> None:
        super().__init__()
        self.names, self.readers, self.mixture = tuple(names), list(readers), mixture
        self.seed, self.rank, self.world_size, self.batch_size, self.epochs = seed, rank, world_size, batch_size, epochs
        if on_resize not in MISMATCH:
            raise ValueError(f"{on_resize=} should be one of {MISMATCH}")
        self.on_resize = on_resize
        self.n = len(mixture)
        self.per_epoch = steps_per_epoch(self.n, world_size=world_size, batch_size=batch_size) * batch_size
        if self.per_epoch == 0:
            raise ValueError(f"the mixture's epoch of {self.n} samples (stop={mixture.stop!r}) makes no full batch "
                             f"of batch_size={batch_size} on each of world_size={world_size} ranks; lower batch_size")
        self._fields = [None if k is None else {**{f"{a}.{x}": f"{b}.{x}" for a, b in k.items() for x in CAMERA_EXTS},
                                                **{f"{a}.npy": f"{b}.npy" for a, b in k.items()}, "json": "json"}
                        for k in keys]
        self._keys = [None if k is None else dict(k) for k in keys]
        self._setup = {ts.WORLD: world_size, ts.RANK: rank, ts.BATCH: batch_size, ts.GLOBAL: world_size * batch_size,
                       ts.FRAMES: {n: len(r.table) for n, r in zip(names, readers)},
                       ts.PLAN: {n: r.table.fingerprint() for n, r in zip(names, readers)},
                       ts.WINDOWS: {k: [w.first, w.last] for k, w in sorted(windows.items())},
                       ts.SOURCES: list(names), ts.WEIGHTS: {n: str(w) for n, w in zip(names, mixture.weights)},
                       ts.STOP_RULE: mixture.stop}
        self._epoch = self._pos = 0
        self._stop: int | None = None
        self._batch: tuple[int, int, np.ndarray, np.ndarray] | None = None  # (epoch, step, sources, frames)

    @property
    def _size(self) -> int:
        return self.n

    def next(self) -> RawSample:
        if self._stop is not None and self._epoch >= self._stop:
            raise StopIteration
        step, i = divmod(self._pos, self.batch_size)
        sources, frames = self._draw(self._epoch, step)
        s = int(sources[i])
        raw = self.readers[s].sample(int(frames[i]))
        self._pos += 1
        if self._pos == self.per_epoch:
            self._epoch, self._pos = self._epoch + 1, 0
        return self._tag(s, raw)

    def close(self) -> None:
        """Close every source's shard files; they are reopened on demand."""
        for r in self.readers:
            r.close()

    def _draw(self, epoch: int, step: int) -> tuple[np.ndarray, np.ndarray]:
        """(source numbers, frame numbers within them) of this rank's batch at global ``step`` (cached)."""
        if self._batch is None or self._batch[:2] != (epoch, step):
            g = self.world_size * self.batch_size
            at = rank_positions(0, rank=self.rank, world_size=self.world_size, batch_size=self.batch_size)
            deal = IndexShuffle.of(g, seed=self.seed, epoch=epoch, stream=(_STEP_STREAM, step))
            src, frames = self.mixture.samples(step * g + deal(at), seed=self.seed, epoch=epoch)
            self._batch = (epoch, step, src, frames)
        return self._batch[2], self._batch[3]

    def _tag(self, s: int, raw: RawSample) -> RawSample:
        """``raw`` with its episode and shard as ``"<source>:<id>"``, its members and windows under batch keys."""
        name = self.names[s]
        item, shard = Item(f"{name}:{raw.item.episode}", raw.item.frame, raw.item.valid), f"{name}:{raw.shard}"
        fields, keys = self._fields[s], self._keys[s]
        if fields is None or keys is None:
            return RawSample(item, shard, raw.members, raw.damaged, raw.windows)
        return RawSample(item, shard, {fields[f]: b for f, b in raw.members.items() if f in fields}, raw.damaged,
                         {keys[k]: w for k, w in raw.windows.items()})
