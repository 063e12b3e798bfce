"""`select`: the episodes a builder reads, by split, ids (``episodes=``) and a predicate (``where=``).

Everything is resolved from the index alone (no shard is opened), in index order, before the pipe is
built, so every rank selects the same episodes and the frame plan and ``len()`` follow from them.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from episodepipes.index import Episode, EpisodeIndex, Tables
from episodepipes.index.v2 import FPS, LENGTH, PROMPT, SCHEMA, SPLIT

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

    ``where`` is called once per distinct combination of the attributes it reads (`keep_numbers`), not once per
    episode: it should be a function of the attributes alone (a predicate, without side effects).

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
        numbers = np.array([e.number for e in chosen], np.int64)
    else:
        numbers = np.arange(len(idx.episodes)) if split is None else idx.split_numbers(split)
        if not len(numbers):
            t = idx.tables
            present = sorted({t.splits[c] for c in np.unique(t.episodes[:, SPLIT]).tolist()})
            raise ValueError(f"split={split!r} has no episodes in {idx.root}; splits there: {present}")
        if where is None:
            return [idx.episodes[n] for n in numbers.tolist()]
    if where is None:
        return chosen
    if not callable(where):
        raise TypeError(f"where={where!r} should be a callable taking an episode's attributes and returning a bool")
    kept = keep_numbers(idx, numbers, where)
    if not len(kept):
        raise ValueError(f"where= keeps none of the {len(numbers)} episodes of split={split!r} in {idx.root}; "
                         f"it sees attributes like {sorted(attributes(idx.episodes[int(numbers[0])]))}")
    return [idx.episodes[n] for n in kept.tolist()]


_ALL = object()  # `_Seen.read` holds it once the predicate saw the whole dict


class _Seen(dict):
    """The attributes dict ``where`` gets, noting which keys it reads (a whole-dict access notes `_ALL`)."""

    def __init__(self, d: dict[str, Any]) -> None:
        super().__init__(d)
        self.read: set = set()

    def __getitem__(self, k: Any) -> Any:
        self.read.add(k)
        return super().__getitem__(k)

    def get(self, k: Any, default: Any = None) -> Any:
        self.read.add(k)
        return super().get(k, default)

    def __contains__(self, k: object) -> bool:
        self.read.add(k)
        return super().__contains__(k)

    def _all(self, name: str) -> Callable:
        self.read.add(_ALL)
        return getattr(super(), name)


def _whole(name: str) -> Callable:
    def method(self: _Seen, *a: Any, **kw: Any) -> Any:
        return self._all(name)(*a, **kw)
    method.__name__ = name
    return method


for _name in ("__iter__", "__reversed__", "keys", "values", "items", "copy", "__eq__", "__ne__", "__repr__",
              "__str__", "__or__", "__ror__", "__ior__", "__reduce__", "__reduce_ex__", "__setitem__", "__delitem__",
              "pop", "popitem", "setdefault", "update", "clear"):
    setattr(_Seen, _name, _whole(_name))
_Seen.__hash__ = None  # type: ignore[assignment]


def keep_numbers(idx: EpisodeIndex, numbers: np.ndarray, where: Where) -> np.ndarray:
    """The episode ``numbers`` that ``where`` keeps, in their order, calling it once per distinct combination of
    what it reads rather than once per episode.

    Episodes of one schema, split, prompt, fps and attribute set differ only in ``id`` and ``length``: ``where`` is
    called on one of them with a dict that notes the keys it reads, and its answer holds for the group unless it read
    ``length`` (then once per distinct length in the group) or ``id`` or the whole dict (then once per episode, as
    every episode's answer may differ). At 10**6 episodes of a few robots this is a few hundred calls, not a million.
    """
    t = idx.tables
    if not len(numbers):
        return numbers
    group, first = _groups(t, numbers)
    verdict = np.zeros(len(first), bool)
    finer: list[tuple[int, dict[str, Any], bool]] = []  # groups whose answer depends on length or id
    for g, at in enumerate(first.tolist()):
        base = attributes(idx.episodes[int(numbers[at])])
        seen = _Seen(base)
        got = _check(where, seen, base["id"])
        if {"id", _ALL} & seen.read or "length" in seen.read:
            finer.append((g, base, not ({"id", _ALL} & seen.read)))
        verdict[g] = got
    keep = verdict[group]
    if finer:
        lengths = t.episodes[numbers, LENGTH]
    for g, base, by_length in finer:
        members = np.flatnonzero(group == g)
        if not by_length:
            _each(idx, where, base, numbers, lengths, members, keep)
            continue
        _, at, sub = np.unique(lengths[members], return_index=True, return_inverse=True)
        for s, a in enumerate(at.tolist()):  # once per distinct length of the group
            rep = int(members[a])
            eid = idx.ids[int(numbers[rep])]
            probe = _Seen(dict(base, id=eid, length=int(lengths[rep])))
            got = _check(where, probe, eid)
            if {"id", _ALL} & probe.read:
                _each(idx, where, base, numbers, lengths, members[sub == s], keep)
            else:
                keep[members[sub == s]] = got
    return numbers[keep]


def _groups(t: Tables, numbers: np.ndarray, *, sort: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(each of ``numbers``' group, the position in ``numbers`` of an episode of each group): episodes of one
    schema, split, prompt, fps and attribute set are a group. No sort when the codes' combinations are few
    (``sort`` sorts anyway: what many combinations take)."""
    cols = [t.episodes[:, c] for c in (SCHEMA, SPLIT, PROMPT, FPS)] + [t.attr]
    whole = len(numbers) * 8 >= len(t.episodes)  # most episodes: combine the columns, then take ``numbers``
    codes = cols if whole else [c[numbers] for c in cols]
    tops = [max(len(x), 1) for x in (t.schemas, t.splits, t.prompts, t.fps, t.attrs)]
    key = codes[0].astype(np.int64)
    if math.prod(tops) < 2**62:  # one mixed-radix key (codes are checked below their tops at open)
        for c, top in zip(codes[1:], tops[1:]):
            key = key * top + c.astype(np.int64)
    else:  # renumber the distinct prefixes before each step, so the key never overflows
        for c, top in zip(codes[1:], tops[1:]):
            key = np.unique(key, return_inverse=True)[1].astype(np.int64) * top + c.astype(np.int64)
    if whole:
        key = key[numbers]
    space = math.prod(tops)
    if space <= 4 * len(key) + 1024 and not sort:  # few combinations: number them through a table, no sort
        firsts = np.full(space, len(key), np.int64)
        firsts[key[::-1]] = np.arange(len(key) - 1, -1, -1)  # a member of each (numpy writes in order: the first)
        present = np.flatnonzero(firsts < len(key))
        dense = np.zeros(space, np.int64)
        dense[present] = np.arange(len(present))
        return dense[key], firsts[present]
    _, first, group = np.unique(key, return_index=True, return_inverse=True)
    return group, first


def _each(idx: EpisodeIndex, where: Where, base: dict[str, Any], numbers: np.ndarray, lengths: np.ndarray,
          members: np.ndarray, keep: np.ndarray) -> None:
    """``where`` on each of ``members`` (positions in ``numbers``) of one group: its dict with each one's id and
    length, no `Episode` made."""
    for m in members.tolist():
        eid = idx.ids[int(numbers[m])]
        keep[m] = _check(where, dict(base, id=eid, length=int(lengths[m])), eid)


def _check(where: Where, attrs: dict[str, Any], eid: str) -> bool:
    got = where(attrs)
    if not isinstance(got, bool | np.bool_):
        raise TypeError(f"where= returned {got!r} for episode {eid!r}; it should return True or False")
    return bool(got)
