"""A weighted mixture of sources in `train_pipe`: `Source`, the mixture reader, and the keys it maps.

Graph: `MixReader` (the `Mixture` interleave over per-source `TrainReader`s, which read the samples) ->
`Decoder` (over `MixIndex`, each source's episodes as the batch sees them) -> `BatchStacker` ->
`SourceNames` (``batch["source"]``); the nodes are in `mix_reader`. Here: the `Source` form, the checks
that the sources' mapped episodes stack, and the builder `train_pipe` calls for a mapping of sources.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from episodepipes.index import Episode, EpisodeIndex
from episodepipes.pipes.batch import BatchStacker
from episodepipes.pipes.builders import RESERVED, open_index, stack_mismatch
from episodepipes.pipes.chosen import choose
from episodepipes.pipes.decode import Decoder
from episodepipes.pipes.frames import JPEG
from episodepipes.pipes.options import DecodeOptions
from episodepipes.pipes.order.mixture import Mixture
from episodepipes.pipes.order.window import Window, plan_windows
from episodepipes.pipes.select import Where
from episodepipes.pipes.stats import Stats
from episodepipes.pipes.train import packed as train_packed
from episodepipes.pipes.train.mix_reader import MixIndex, MixReader, Sourced, SourceNames, View, view
from episodepipes.pipes.train.state import TrainPipe

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Source:
    """One source of a `train_pipe` mixture: ``train_pipe({"droid": Source("s3://b/droid", 0.6), ...})``.

    Attributes:
        root: the shard folder, its ``index.json``, a remote root (``s3://``, ``gs://``, ``https://``) or an
            open `EpisodeIndex`.
        weight: its share of the samples, a positive number (weights are normalised; a float is taken as
            the decimal it prints as, so ``0.6`` is exactly 3/5).
        keys: ``{source key: batch key}``: the cameras and arrays to take, renamed (e.g.
            ``{"observation.images.top": "image", "action": "action"}``); the others are dropped before
            decoding. None takes every key as it is.
        split: the split to read; None: the pipe's ``split``.
        episodes: ids of this source's episodes to read; None for every one of the split.
        where: ``where(attributes) -> bool`` over this source's episodes; None keeps all.
    """

    root: EpisodeIndex | str | os.PathLike
    weight: Any
    keys: Mapping[str, str] | None = None
    split: str | None = None
    episodes: Sequence[str] | None = None
    where: Where | None = None


def parse_sources(sources: Mapping[str, Any]) -> dict[str, Source]:
    """Check the mapping's form: ``{name: Source(...)}``, names non-empty strs; every other form is refused."""
    if not sources:
        raise ValueError("train_pipe got an empty mapping of sources; pass {name: Source(root, weight)}")
    out = {}
    for name, src in sources.items():
        if not isinstance(name, str) or not name or ":" in name:
            raise ValueError(f"mixture source name {name!r} should be a non-empty str without ':'")
        if not isinstance(src, Source):
            raise TypeError(f"mixture source {name!r} is a {type(src).__name__}; write {name!r}: Source(root, "
                            "weight, keys=...) (from episodepipes.pipes import Source): one form for every source")
        if src.keys is not None and (not isinstance(src.keys, Mapping) or not src.keys or not all(
                isinstance(k, str) and isinstance(v, str) and v for k, v in src.keys.items())):
            raise ValueError(f"Source {name!r} keys={src.keys!r} should be a non-empty dict of source key -> "
                             "batch key (strs)")
        if src.keys is not None and len(set(src.keys.values())) != len(src.keys):
            raise ValueError(f"Source {name!r} keys={dict(src.keys)!r} maps two source keys to one batch key")
        out[name] = src
    return out


def check_keys(name: str, ep: Episode, keys: Mapping[str, str] | None) -> None:
    """Refuse a ``keys`` entry naming a key the source's (first) episode does not have."""
    known = {*ep.cameras, *ep.arrays}
    unknown = sorted(set(keys or ()) - known)
    if unknown:
        raise ValueError(f"Source {name!r} keys= names {unknown}, not cameras or arrays of its episode {ep.id!r}; "
                         f"known: {sorted(known)}")


def schemas(eps: Sequence[Episode], keys: Mapping[str, str] | None) -> list[View]:
    """One mapped `View` per schema among ``eps`` (episodes of one schema share their dicts): what the
    batch check compares, without a view per episode."""
    out: dict[tuple[int, int], View] = {}
    for e in eps:
        if (id(e.cameras), id(e.arrays)) not in out:
            out[id(e.cameras), id(e.arrays)] = view(e, keys)
    return list(out.values())


def check_mix_batchable(views: Mapping[str, Sequence[View]], resize: tuple[int, int] | None) -> None:
    """Refuse sources whose mapped episodes cannot share a batch, naming both sources, episodes and the key.

    Each schema of each source (after its ``keys``) is compared with the first source's first episode:
    the same camera and array keys, array dtypes and shapes, and (without ``resize``) camera sizes.
    """
    first_name = next(iter(views))
    first = views[first_name][0]
    for name, vs in views.items():
        for v in vs:
            why, fix = stack_mismatch(first, v), ("map their keys alike with Source(keys=...), or re-shard them "
                                                  "with the same keys, dtypes and shapes")
            if why is None and resize is None:
                sizes = [{c: (cam.height, cam.width) for c, cam in x.cameras.items()} for x in (first, v)]
                if sizes[0] != sizes[1]:
                    why = f"camera sizes are {sizes[0]} in episode {first.id!r} but {sizes[1]} in {v.id!r}"
                    fix = "pass resize=(H, W)"
            if why:
                raise ValueError(f"source {first_name!r} episode {first.id!r} and source {name!r} episode {v.id!r} "
                                 f"cannot share a batch: {why}; {fix}")
    clash = sorted({*RESERVED, "source"} & {*first.cameras, *first.arrays})
    if clash:
        raise ValueError(f"batch keys {clash} of the mixture clash with {sorted({*RESERVED, 'source'})}; rename "
                         "them with Source(keys=...)")


def source_windows(windows: Mapping[str, Window], keys: Mapping[str, str] | None) -> dict[str, Window]:
    """The batch-key windows under a source's own keys (what its `TrainReader` reads)."""
    back = {b: a for a, b in keys.items()} if keys is not None else {}
    out = {}
    for k, w in windows.items():
        src = back.get(k, k)
        out[src] = Window(src, f"{src}{w.field[len(k):]}", w.first, w.last)
    return out


def mixture_pipe(sources: Mapping[str, Any], *, split: str, batch_size: int, seed: int,
                 history: Mapping[str, int] | None, horizon: Mapping[str, int] | None, rank: int, world_size: int,
                 inferred: bool, options: DecodeOptions, transform: Callable[[dict[str, Any]], dict[str, Any]] | None,
                 epochs: int | None, on_resize: str, stop: str) -> TrainPipe:
    """`train_pipe` over a mapping of sources (its arguments checked there; see its docstring)."""
    srcs = parse_sources(sources)
    names = tuple(srcs)
    idxs, views, readers = [], {}, []
    for name, src in srcs.items():
        idx = open_index(src.root)
        eps = choose(idx, src.split or split, episodes=src.episodes, where=src.where)  # columns, not objects
        check_keys(name, eps[0], src.keys)
        train_packed.check_trainable(idx, f"source {name!r} ({idx.root})")
        idxs.append((idx, eps))
        views[name] = schemas(eps.schemas(), src.keys)
    check_mix_batchable(views, options.resize)
    first = views[names[0]][0]
    windows = plan_windows(history, horizon, cameras=set(first.cameras), arrays=set(first.arrays))
    stats = Stats()
    video = train_packed.mixture_frames([i for i, _ in idxs], [s.keys for s in srcs.values()], list(names))
    for (idx, eps), src in zip(idxs, srcs.values()):
        readers.append(train_packed.mixture_reader(
            idx, eps, src.keys, video, windows=source_windows(windows, src.keys), seed=seed, rank=0, world_size=1,
            batch_size=1, epochs=None, stats=stats))
    mix = Mixture.of({n: s.weight for n, s in srcs.items()}, {n: len(r.table) for n, r in zip(names, readers)},
                     stop=stop)
    keys = [s.keys for s in srcs.values()]
    reader = MixReader(names, readers, keys, mix, windows=windows, seed=seed, rank=rank, world_size=world_size,
                       batch_size=batch_size, epochs=epochs, on_resize=on_resize)
    fn = None if transform is None else Sourced(transform)
    dec = Decoder(reader, MixIndex(names, [i for i, _ in idxs], keys), options, stats=stats,  # type: ignore[arg-type]
                  transform=fn, frames=train_packed.TrainFrames(video) if video else JPEG, share_frames=True,
                  cursor=reader)
    per = reader.per_epoch // batch_size
    log.debug("train_pipe: a mixture of %s, %d samples and %d batches per epoch on rank %d of %d", names, reader.n,
              per, rank, world_size)
    root = SourceNames(BatchStacker(dec, batch_size=batch_size, stats=stats, rows=dec))
    return TrainPipe(root, length=None if epochs is None else epochs * per, index=idxs[0][0], stats=stats,
                     reader=reader, rank_world=(rank, world_size) if inferred else None,
                     state_path=(SourceNames.SOURCE_KEY, BatchStacker.SOURCE_KEY, Decoder.SOURCE_KEY))
