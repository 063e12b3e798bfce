"""An index's normalization statistics: read from the side file `statsfile.NAME` (or an older index's JSON fields)
on first use, checked field by field and against the episodes' step counts, and looked up by split and key.

Most opens never ask for them, so `EpisodeIndex` calls `load` on first use (`stats`, `stats_keys`), not at open.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from episodepipes.index.check import IndexFormatError
from episodepipes.index.load import read_regular
from episodepipes.index.tables import Tables
from episodepipes.index.v2 import LENGTH, SCHEMA, SPLIT
from episodepipes.normstats import StatsTable
from episodepipes.normstats import sidefile as statsfile
from episodepipes.normstats.fields import check_counts, no_stats_hint
from episodepipes.normstats.fields import load as load_stats
from episodepipes.shardio import ByteSource, ShardTooLargeError

Stats = tuple[StatsTable | None, dict[tuple[str, str], str]]


def load(meta: dict, tables: Tables, *, file: str, root: str, source: ByteSource | None,
         location: Callable[[str], str]) -> Stats:
    """(the statistics or None when the index has none, the reason for each (split, key) it lacks), checked.

    Args:
        meta: the index's metadata (v2's JSON part); tables: its tables; file: its ``index.json``, for messages.
        root: the dataset root; source: its byte source when remote (None: a local folder).
        location: where a file of the dataset is, for messages (`EpisodeIndex.location`).
    """
    side = location(statsfile.NAME)
    if source is None:
        def read() -> bytes:
            return _read_local(Path(root), meta, file)
    else:
        def read() -> bytes:
            return _read_remote(source, side, meta, file)
    try:
        table, missing = load_stats(meta, where=file, read_side=read, side=side)
        if table is not None:
            ep = tables.episodes
            check_counts(table, missing, ep[:, LENGTH], ep[:, SCHEMA], ep[:, SPLIT],
                         [sc["arrays"] for sc in meta["schemas"]], tables.splits,
                         side if statsfile.FIELD in meta else file)
    except ValueError as e:
        raise IndexFormatError(f"{e}; recompute them: episodepipes-shard stats {root} --recompute") from None
    return table, missing


def _read_local(root: Path, meta: dict, file: str) -> bytes:
    """The local side file's bytes: a FIFO or device in its place is refused, and a file larger than the index says
    (a sparse one costs no disk) is refused by its size, before it is read."""
    path, desc = root / statsfile.NAME, meta.get(statsfile.FIELD)
    size = os.stat(path).st_size
    if type(desc.get("bytes")) is int and size > desc["bytes"]:  # `statsfile.read` checked the descriptor
        raise statsfile.mismatch(str(path), size, file)
    return read_regular(path, "restore it", error=ValueError)


def _read_remote(source: ByteSource, side: str, meta: dict, file: str) -> bytes:
    """The remote side file's bytes: one larger than the index says is refused by its size (a HEAD) before any of
    it is downloaded, as `_read_local` refuses a local one."""
    desc = meta.get(statsfile.FIELD)
    limit = desc["bytes"] if type(desc.get("bytes")) is int else None  # `statsfile.read` checked the descriptor
    try:
        return source.read_file(statsfile.NAME, limit=limit)
    except ShardTooLargeError as e:
        raise statsfile.mismatch(side, e.size, file) from None


def summary(stats: Stats, file: Path | str, key: str, split: str) -> dict[str, Any]:
    """`EpisodeIndex.stats`: ``stats`` (what `load` gave) for ``key`` in ``split``; a KeyError naming the index
    ``file`` and what it has when there are none."""
    table, missing = stats
    if table is None:
        raise KeyError(no_stats_hint(file))
    if (split, key) in missing:
        raise KeyError(f"{file} has no statistics for {key!r} in split {split!r}: "
                       f"{missing[(split, key)]}")
    if (split, key) not in table.keys():
        have = sorted(f"{s}/{k}" for s, k in table.keys() if (s, k) not in missing)
        raise KeyError(f"{file} has no statistics for {key!r} in split {split!r}; it has {have}")
    entry = table.get(key, split=split)
    if not entry.count:  # an entry of no steps, which the index's episodes let through only where none have the key
        raise KeyError(f"{file} has no statistics for {key!r} in split {split!r}: they count no steps")
    return entry.summary()
