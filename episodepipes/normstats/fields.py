"""The ``stats`` and ``stats_missing`` fields of an index: exact per-(split, key) statistics, built in episode order.

A write folds each episode's statistics (made in its encoder process) into a `StatsFields` in episode
order; `merge` folds the job tables in job order with the same rule, so the merged fields equal a
single job's, byte for byte. The rule, per (split, key): while no episode has failed, parts merge; the
first failure (NaN or infinite values, a non-numeric dtype, a step shape that differs from the earlier
episodes') records its reason in ``stats_missing`` and freezes the entry. A frozen entry stays in
``stats`` (a later job's merge needs it to find the same first failure) but is never served.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from episodepipes.normstats import sidefile as statsfile
from episodepipes.normstats.exact import ArrayStats, StatsTable, add_fresh

log = logging.getLogger(__name__)

STATS = "stats"
MISSING = "stats_missing"
Part = tuple[dict[str, ArrayStats], dict[str, str]]  # one episode's statistics per key, and its failures
MAX_ELEMENTS = 1024  # per step; the exact sums' scratch grows with elements (an image stored as an array has 10**5)


def episode_part(eid: str, arrays: Mapping[str, Any]) -> Part:
    """One episode's statistics per array key; a key whose values cannot have statistics gets a reason instead.

    Every key's columns go through one pass together (`add_fresh`): an episode has a few small arrays, and
    per-key passes cost mostly numpy's per-call overhead."""
    items, failed = [], {}
    for key, values in sorted(arrays.items()):
        a = np.asarray(values)
        if a.ndim and math.prod(a.shape[1:]) > MAX_ELEMENTS:
            failed[key] = (f"array {key!r} has {math.prod(a.shape[1:])} elements per step, more than the "
                           f"{MAX_ELEMENTS} statistics are kept for (normalize such arrays another way)")
            continue
        items.append((key, ArrayStats(a.shape[1:]), a))
    errors = add_fresh([(acc, a, f"episode {eid!r} array {key!r}") for key, acc, a in items])
    stats = {}
    for (key, acc, _), err in zip(items, errors):
        if err is None:
            stats[key] = acc
        else:
            failed[key] = err
    return stats, dict(sorted(failed.items()))


class StatsFields:
    """Per (split, key): the statistics so far, and the reason they stopped (None while they are complete)."""

    def __init__(self) -> None:
        self.stats: dict[tuple[str, str], ArrayStats] = {}
        self.missing: dict[tuple[str, str], str] = {}
        self.unsaved: list[tuple[str, Mapping, Mapping]] | None = None  # folded parts a progress log has yet to save
        self._encoded: bytes | None = None  # `encode`'s bytes, until the next `add`

    def encode(self) -> bytes:
        """The side file's bytes (`episodepipes.normstats.sidefile.encode`), made once until more is folded in: a run's
        last progress save and its side file often encode the same statistics."""
        if self._encoded is None:
            self._encoded = statsfile.encode(self.stats, self.missing)
        return self._encoded

    def write(self, path: Path) -> dict[str, Any]:
        """Write them as a side file (`normstats.sidefile`) at ``path``; returns the index field naming it."""
        return statsfile.write_raw(path, self.encode())

    def add(self, split: str, stats: Mapping[str, ArrayStats], failed: Mapping[str, str]) -> None:
        """Fold in the statistics of the next episode (or job) of ``split``, in output order."""
        self._encoded = None
        if self.unsaved is not None:
            self.unsaved.append((split, stats, failed))
        for key in sorted(stats.keys() | failed.keys()):
            at = (split, key)
            if at in self.missing:
                continue
            part = stats.get(key)
            if part is not None:
                have = self.stats.get(at)
                if have is None:
                    self.stats[at] = ArrayStats(part.shape)
                    self.stats[at].update(part)
                elif have.shape != part.shape:
                    self.missing[at] = (f"array {key!r} has steps of shape {part.shape} in some episodes and "
                                        f"{have.shape} in earlier ones")
                    continue
                else:
                    have.update(part)
            if key in failed:
                self.missing[at] = failed[key]

    def add_fields(self, data: Mapping[str, Any], *, where: str, read_side: Callable[[], bytes] | None = None,
                   side: str = statsfile.NAME) -> None:
        """Fold in the fields of a job's index (or of saved progress), checked first; ``read_side()`` gives the
        bytes of the side file it names (a local or remote job's), called ``side`` in errors."""
        table, missing = load(data, where=where, read_side=read_side, side=side)
        if table is None:
            raise ValueError(f"{where} has no statistics (written by an older episodepipes?); re-run it with "
                             "--overwrite")
        self.add_loaded(table, missing)

    def add_loaded(self, table: StatsTable, missing: Mapping[tuple[str, str], str]) -> None:
        """Fold in a whole table (and its failures), split by split, as `add_fields` does."""
        for split in sorted({s for s, _ in table.keys()} | {s for s, _ in missing}):
            self.add(split, {k: table.get(k, split=s) for s, k in table.keys() if s == split},
                     {k: r for (s, k), r in missing.items() if s == split})

    def to_json(self) -> dict[str, Any]:
        """``{"stats": ..., "stats_missing": ...}``, the second only when some key failed."""
        out: dict[str, Any] = {STATS: StatsTable(self.stats).to_json()}
        if self.missing:
            by: dict[str, dict[str, str]] = {}
            for (split, key), reason in sorted(self.missing.items()):
                by.setdefault(split, {})[key] = reason
            out[MISSING] = by
        return out


def load(data: Mapping[str, Any], *, where: str, read_side: Callable[[], bytes] | None = None,
         side: str = statsfile.NAME) -> tuple[StatsTable | None, dict[tuple[str, str], str]]:
    """(table or None when ``data`` has no statistics, (split, key) -> reason), every field checked by name.

    ``data`` names a side file (``stats_file``, read through ``read_side``, named ``side`` in errors), or holds
    the statistics itself (``stats``/``stats_missing``, as indexes before the side file did).
    """
    if statsfile.FIELD in data:
        if STATS in data or MISSING in data or read_side is None:
            raise ValueError(f"{where}: has {statsfile.FIELD} and also {STATS} or {MISSING} (or no folder to "
                             "read it from)")
        return statsfile.read(read_side, data[statsfile.FIELD], where=where, file=side)
    raw_missing = data.get(MISSING, {})
    if not isinstance(raw_missing, dict) or not all(
            isinstance(keys, dict) and all(isinstance(k, str) and isinstance(r, str) for k, r in keys.items())
            for keys in raw_missing.values()):
        raise ValueError(f"{where}: {MISSING} should be an object of splits, each an object of key -> reason")
    missing = {(s, k): r for s, keys in raw_missing.items() for k, r in keys.items()}
    if STATS not in data:
        if missing:
            raise ValueError(f"{where}: {MISSING} is set but {STATS} is not")
        return None, {}
    return StatsTable.from_json(data[STATS], where=where), missing


def check_counts(table: StatsTable, missing: Mapping[tuple[str, str], str], lengths: np.ndarray,
                 schema: np.ndarray, split: np.ndarray, schemas: list[dict], splits: list[str], where: str) -> None:
    """Each served entry counts exactly the steps of its split's episodes that have the key.

    Args:
        lengths, schema, split: per episode, its length and its schema and split codes (the v2 tables).
        schemas: each schema's ``arrays``; splits: the split names the codes number.
    """
    per = np.zeros((len(schemas), len(splits)), np.uint64)
    np.add.at(per, (schema.astype(np.int64), split.astype(np.int64)), lengths.astype(np.uint64))
    steps: dict[tuple[str, str], int] = {}
    for (j, t), n in np.ndenumerate(per):
        for key in schemas[j]:
            steps[(splits[t], key)] = steps.get((splits[t], key), 0) + int(n)
    for sp, key in table.keys():
        if (sp, key) in missing:
            continue
        got, want = table.get(key, split=sp).count, steps.get((sp, key), 0)
        if got != want:
            raise ValueError(f"{where}: stats[{sp!r}][{key!r}] count={got}, but the index's {sp} episodes "
                             f"with {key!r} have {want} steps")


def check_steps(fields: StatsFields, episodes: list[dict], where: str) -> None:
    """Each entry ``fields`` serves counts exactly the steps of the (checked, v1-style) ``episodes`` of its split
    that have its key: statistics saved beside a resumed write's progress, before any more are folded in."""
    steps: dict[tuple[str, str], int] = {}
    for e in episodes:
        for key in e["arrays"]:
            steps[(e["split"], key)] = steps.get((e["split"], key), 0) + e["length"]
    for (split, key), acc in sorted(fields.stats.items()):
        if (split, key) not in fields.missing and acc.count != steps.get((split, key), 0):
            raise ValueError(f"{where}: stats[{split!r}][{key!r}] count={acc.count}, but the finished {split} "
                             f"episodes with {key!r} have {steps.get((split, key), 0)} steps")


def no_stats_hint(file: Path) -> str:
    return (f"{file} has no statistics (written before episodepipes computed them); compute them with: "
            f"episodepipes-shard stats {file.parent} --recompute")


def has_stats(data: Mapping[str, Any]) -> bool:
    """Whether an index's (or progress file's) fields carry statistics, in a side file or inline."""
    return STATS in data or statsfile.FIELD in data
