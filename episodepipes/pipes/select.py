"""`select`: the episodes a builder reads, by split, ids (``episodes=``) and a predicate (``where=``).

Everything is resolved from the index alone (no shard is opened), in index order, before the pipe is
built, so every rank selects the same episodes and the frame plan and ``len()`` follow from them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from episodepipes.index import Episode, EpisodeIndex

Where = Callable[[dict[str, Any]], bool]


def attributes(e: Episode) -> dict[str, Any]:
    """What ``where=`` sees of an episode: id, split, length, fps, prompt (its task), camera and array names,
    and its attributes (`Episode.meta`): the extra keys of a raw ``meta.json`` (``"robot": "franka"``), a zarr
    group's scalar attrs, LeRobot's ``robot_type``, which the writer carries into the index. An attribute never
    shadows a built-in field: the writer refuses such names (`episodepipes.episode_attrs`)."""
    return {**e.meta, "id": e.id, "split": e.split, "length": e.length, "fps": e.fps, "prompt": e.prompt,
            "cameras": sorted(e.cameras), "arrays": sorted(e.arrays)}


def select(idx: EpisodeIndex, split: str | None, *, episodes: Sequence[str] | None = None,
           where: Where | None = None, index_order: bool = True) -> list[Episode]:
    """The episodes of ``split`` (every split for None) among ``episodes`` (ids) that ``where`` keeps.

    Args:
        idx: the index.
        split: a split name, or None for ids from any split.
        episodes: episode ids to read (each must be in the index, and in ``split``); None for all.
        where: ``where(attributes) -> bool`` over `attributes`; None keeps every episode.
        index_order: sort ``episodes`` into index order (False keeps the order given, as `video_pipe` does).
    """
    if episodes is not None:
        if isinstance(episodes, str) or not episodes:
            raise ValueError(f"episodes={episodes!r} should be a non-empty list of episode ids")
        if len(set(episodes)) != len(episodes):
            dup = sorted(e for e, n in Counter(episodes).items() if n > 1)
            raise ValueError(f"episodes= names {dup} more than once; list each id once")
        chosen = [idx.episode(e) for e in episodes]  # unknown ids raise with close matches
        other = [e.id for e in chosen if split is not None and e.split != split]
        if other:
            raise ValueError(f"episodes= names {other[:5]}, which are not in split={split!r}; pass their split "
                             "or drop them")
        if index_order:  # as without episodes=
            chosen.sort(key=lambda e: e.number)
    else:
        chosen = list(idx.episodes) if split is None else idx.split(split)
        if not chosen:
            raise ValueError(f"split={split!r} has no episodes in {idx.root}; splits there: "
                             f"{sorted({e.split for e in idx.episodes})}")
    if where is None:
        return chosen
    if not callable(where):
        raise TypeError(f"where={where!r} should be a callable taking an episode's attributes and returning a bool")
    kept = [e for e in chosen if _keep(where, e)]
    if not kept:
        raise ValueError(f"where= keeps none of the {len(chosen)} episodes of split={split!r} in {idx.root}; "
                         f"it sees attributes like {sorted(attributes(chosen[0]))}")
    return kept


def _keep(where: Where, e: Episode) -> bool:
    got = where(attributes(e))
    if not isinstance(got, bool | np.bool_):
        raise TypeError(f"where= returned {got!r} for episode {e.id!r}; it should return True or False")
    return bool(got)
