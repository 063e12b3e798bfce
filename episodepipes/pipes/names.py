"""Batch key names: the index's tar-safe names (the default), or the source dataset's own (LeRobot's).

Sharding makes every camera and array name tar-safe (``observation.images.top`` is stored as
``observation_images_top``) and keeps the original in the index as that key's ``source``. With
``names="lerobot"`` a pipe's batches carry the ``source`` names instead, and each window's mask is
``<source>_is_pad`` (LeRobot's) instead of ``<key>_pad``; ``task`` (LeRobot's name of the prompt) is added
beside ``prompt``. The other batch keys (``episode``, ``frame``, ``timestamp``, ``valid``, ``prompt``) keep
their names. A dataset sharded from raw folders or zarr has ``source == name``, so only the masks change.

The default stays ``"index"``: the index's names are the ones `EpisodeIndex.stats`, ``keys=`` of a mixture,
``gt_key=`` of the overlay writer and ``info`` show, so a batch keyed by them needs no second vocabulary, and
code written against the default keeps working. A LeRobot policy asks for ``names="lerobot"``.

The ``source`` names come from the index, a file from anyone: they are refused by name unless each is 1 to
`MAX_NAME` characters of ``A-Z a-z 0-9 _ . - /`` (not starting with ``.`` or ``/``), no two keys share one, every
episode of the pipe gives a key the same one, and none (nor a mask) takes a batch key the pipe sets itself.

The renaming is a node (`BatchKeys`) after the batch stacker: a dict of the same tensors under other keys,
with its source's state as its own, so a checkpoint resumes with or without it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from torchdata.nodes import BaseNode

from episodepipes.index import Episode, EpisodeIndex
from episodepipes.pipes._decode.lifecycle import shutdown_node

NAMES = ("index", "lerobot")
MAX_NAME = 128
PAD, LEROBOT_PAD = "_pad", "_is_pad"
TASK = "task"
BATCH_KEYS = ("episode", "frame", "timestamp", "valid", "prompt", "source", TASK)  # set by the pipe itself
_SOURCE_NAME = re.compile(r"[A-Za-z0-9_\-][A-Za-z0-9_.\-/]*")


def check_names(names: object) -> str:
    """``names`` if it is one of `NAMES`, else a ValueError naming the choices."""
    if not isinstance(names, str) or names not in NAMES:
        raise ValueError(f"names={names!r} should be one of {list(NAMES)}: 'index' keys batches by the index's "
                         "tar-safe names, 'lerobot' by the source dataset's own (observation.images.top) with "
                         "<key>_is_pad masks")
    return names


def source_names(index: EpisodeIndex, episodes: Sequence[Episode]) -> dict[str, str]:
    """``{index key: source name}`` of the episodes' cameras and arrays, checked (see the module docstring).

    Args:
        index: the index the episodes come from (named in errors).
        episodes: the pipe's episodes (`check_batchable` has made their keys the same).
    """
    out: dict[str, str] = {}
    first: dict[str, Episode] = {}
    seen: set[tuple[int, int]] = set()
    for e in episodes:
        same = (id(e.cameras), id(e.arrays))  # a v2 index shares one schema's dicts among its episodes
        if same in seen:
            continue
        seen.add(same)
        for key, spec in [*e.cameras.items(), *e.arrays.items()]:
            name = spec.source
            where = f"{index.root}: episode {e.id!r} key {key!r}"
            if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME or not _SOURCE_NAME.fullmatch(name):
                raise ValueError(f"{where} has source name {str(name)[:MAX_NAME]!r}, not 1-{MAX_NAME} characters of "
                                 "A-Z a-z 0-9 _ . - / (not starting with '.' or '/'); fix the index's source field, "
                                 "or use names='index'")
            if key in out and out[key] != name:
                raise ValueError(f"{where} has source name {name!r} but episode {first[key].id!r} gives it "
                                 f"{out[key]!r}; re-shard them alike, or use names='index'")
            out[key], first[key] = name, first.get(key, e)
    by_name: dict[str, str] = {}
    for key, name in out.items():
        if name in by_name:
            raise ValueError(f"{index.root}: keys {by_name[name]!r} and {key!r} have one source name {name!r}; "
                             "fix the index's source fields, or use names='index'")
        by_name[name] = key
    return out


def window_keys(episodes: Sequence[Episode]) -> dict[str, str]:
    """``{source name: index key}`` of the first episode's cameras and arrays whose names differ, where one key has
    that source name: so a window given by a LeRobot name (``"observation.state"``) reaches the index's key
    (``observation_state``). Only looked up with the caller's keys, so the names need no check here."""
    if not episodes:
        return {}
    e = episodes[0]
    pairs = [(spec.source, k) for k, spec in [*e.cameras.items(), *e.arrays.items()] if spec.source != k]
    counts: dict[str, int] = {}
    for s, _ in pairs:
        counts[s] = counts.get(s, 0) + 1
    own = set(e.cameras) | set(e.arrays)
    return {s: k for s, k in pairs if counts[s] == 1 and s not in own}


def lerobot_keys(index: EpisodeIndex, episodes: Sequence[Episode], windowed: Iterable[str]) -> dict[str, str]:
    """``{batch key: LeRobot name}`` for a pipe over ``episodes`` whose ``windowed`` keys carry masks.

    Only keys whose name changes are listed. A source name (or a mask) that would take a key the pipe sets
    itself (`BATCH_KEYS`), or another key's name or mask, is refused naming both.
    """
    sources = source_names(index, episodes)
    rename = {k: s for k, s in sources.items() if k != s}
    for k in windowed:
        rename[k + PAD] = sources.get(k, k) + LEROBOT_PAD
    taken: dict[str, str] = {}
    kept = [k for k in sources if k not in rename]
    for old, new in [*((k, k) for k in kept), *rename.items()]:
        if new in BATCH_KEYS or new in taken:
            other = repr(taken[new]) if new in taken else "a key the pipe sets itself"
            raise ValueError(f"{index.root}: batch key {old!r} would be named {new!r}, which is {other}; fix the "
                             "index's source fields, or use names='index'")
        taken[new] = old
    return rename


def batch_keys(names: str, index: EpisodeIndex, episodes: Sequence[Episode],
               windowed: Iterable[str]) -> dict[str, str] | None:
    """What `BatchKeys` renames for ``names`` (`check_names`): None for ``"index"`` (nothing to do)."""
    if check_names(names) == "index" or not episodes:
        return None
    return lerobot_keys(index, episodes, windowed)


class BatchKeys(BaseNode[dict]):
    """Each batch of ``source`` with the windows of ``trim`` cut (``{key: (front, back)}`` steps, masks too), then
    its keys renamed by ``rename`` (others kept) and ``task`` set to its prompts when ``rename`` is given.

    Its state is its source's (``get_state`` returns it and ``reset`` passes it down), so a pipe's state has the
    same shape with or without it.
    """

    def __init__(self, source: BaseNode[dict], rename: Mapping[str, str] | None,
                 trim: Mapping[str, tuple[int, int]] | None = None) -> None:
        super().__init__()
        self.source, self.rename, self.trim = source, None if rename is None else dict(rename), dict(trim or {})

    def reset(self, initial_state: dict | None = None) -> None:
        super().reset(initial_state)
        self.source.reset(initial_state)

    def next(self) -> dict[str, Any]:
        batch = dict(next(self.source))
        for key, (front, back) in self.trim.items():
            for k in (key, key + PAD):
                v = batch[k]
                batch[k] = v[:, front:v.shape[1] - back].contiguous()  # a policy may .view() it
        if self.rename is None:
            return batch
        out = {self.rename.get(k, k): v for k, v in batch.items()}
        if "prompt" in batch:
            out[TASK] = list(batch["prompt"])
        return out

    def get_state(self) -> dict[str, Any]:
        return self.source.state_dict()

    def shutdown(self) -> None:
        """Shut the source down (its workers), as the node this one stands in for."""
        shutdown_node(self.source)


def keyed(node: BaseNode[dict], rename: Mapping[str, str] | None,
          trim: Mapping[str, tuple[int, int]] | None = None) -> BaseNode[dict]:
    """``node``, or a `BatchKeys` over it when there is something to rename or trim."""
    return node if rename is None and not trim else BatchKeys(node, rename, trim)


def keyed_builder(build: Callable[[], BaseNode[dict]], rename: Mapping[str, str] | None,
                  trim: Mapping[str, tuple[int, int]] | None = None) -> Callable[[], BaseNode]:
    """A `Gate`'s ``build`` whose node is `keyed` (``build`` itself when there is nothing to do)."""
    if rename is None and not trim:
        return build
    return lambda: BatchKeys(build(), rename, trim)
