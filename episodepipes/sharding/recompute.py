"""Statistics read back from finished shards: for an index written before statistics existed
(``episodepipes-shard stats OUT --recompute``) and for resuming a write whose progress file has none;
and the statistics a resumed write starts from (`resumed_stats`).

The arrays are read through the same tar member parser as the pipes, each frame checked against the
index's crc32 first, and folded in index order with the writer's rule (`StatsFields`), so recomputed
fields equal the ones a fresh write would have stored.
"""

from __future__ import annotations

import io
import json
import logging
import math
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from episodepipes import safefile
from episodepipes.errors import ShardTruncatedError
from episodepipes.format import INDEX_NAME, npy_header
from episodepipes.index import EpisodeIndex
from episodepipes.index.shardread import ranges
from episodepipes.normstats import sidefile as statsfile
from episodepipes.normstats.fields import MISSING, STATS, StatsFields, episode_part
from episodepipes.sharding.write.lock import write_lock
from episodepipes.sharding.write.progress import PROGRESS_NAME, Progress
from episodepipes.sharding.write.progress_stats import read_log
from episodepipes.tarmembers import frame_fields

log = logging.getLogger(__name__)


def _npy(data: bytes, spec: dict, where: str) -> np.ndarray:
    try:
        a = np.lib.format.read_array(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, SyntaxError) as e:
        raise ValueError(f"{where}: not a readable .npy member ({e}); re-shard it") from None
    if a.dtype.str != np.dtype(spec["dtype"]).str or list(a.shape) != list(spec["shape"]):
        raise ValueError(f"{where}: holds {a.dtype.str}{a.shape}, the index says {spec['dtype']}"
                         f"{tuple(spec['shape'])}; re-shard it")
    return a


def _record_arrays(data: bytes, entry: dict, keys: list[str], where: str) -> dict[str, bytes]:
    """A packed record's array rows as the ``.npy`` members the members layout holds."""
    from episodepipes.codec.chunk import parse_record

    try:
        rec = parse_record(data, len(entry["cameras"]), len(keys), where=where)
    except ValueError as e:
        raise ValueError(str(e) if str(e).endswith("re-shard it") else f"{e}; re-shard it") from None
    out = {}
    for k, row in zip(keys, rec.rows):  # .npy parsing would read a longer row's first bytes and drop the rest
        dt, shape = np.dtype(entry["arrays"][k]["dtype"]), tuple(entry["arrays"][k]["shape"])
        if len(row) != dt.itemsize * math.prod(shape):
            raise ValueError(f"{where} {k}: its row has {len(row)} bytes in the record, not one {dt.str} {shape} "
                             "step; the shard is damaged, re-shard it")
        out[f"{k}.npy"] = npy_header(dt, shape) + bytes(row)
    return out


def _sliced(data: bytes, base: int) -> Callable[[int, int], bytes]:
    """``pread(size, offset)`` over a frame's bytes read at ``base``."""
    return lambda size, off: data[off - base:off - base + size]


def episode_arrays(root: Path, shards: list[dict], entry: dict) -> dict[str, np.ndarray]:
    """Every array of one episode (index entry ``entry``), read from its shards under ``root``."""
    keys = sorted(entry["arrays"])
    rows: dict[str, list[np.ndarray]] = {k: [] for k in keys}
    if not keys:
        return {}
    want = {f"{k}.npy" for k in keys}
    for seg in entry["segments"]:
        name = shards[seg["shard"]]["name"]
        bounds = [*seg["offsets"], seg["end"]]
        crcs = seg.get("crc32") or [None] * seg["count"]
        with ranges(root / name) as pread:  # checked reads, not a mapping (`index.shardread` says why)
            for k, (a, b) in enumerate(zip(bounds, bounds[1:])):
                where = f"shard {root / name}: episode {entry['id']!r} frame {seg['first'] + k}"
                if "heads" in seg:  # the packed layout: the frame is its record inside its span
                    a += seg["heads"][k]
                    b = a + seg["sizes"][k]
                try:
                    data = pread(b - a, a)
                except ShardTruncatedError:
                    data = None
                if data is None or (crcs[k] is not None and zlib.crc32(data) != crcs[k]):
                    raise ValueError(f"{where}: its bytes do not match the index's crc32 (or the shard is "
                                     "truncated); restore the shard or re-shard")
                if "heads" in seg:
                    fields = _record_arrays(data, entry, keys, where)
                else:
                    fields, _ = frame_fields(_sliced(data, a), a, b, entry["id"], seg["first"] + k, want, where=where)
                for key in keys:
                    rows[key].append(_npy(fields[f"{key}.npy"], entry["arrays"][key], f"{where} {key}.npy"))
    return {k: np.stack(v) for k, v in rows.items()}


def recompute(root: Path, shards: list[dict], episodes: list[dict]) -> StatsFields:
    """The statistics of ``episodes`` (index entries, in index order) read from their shards."""
    out = StatsFields()
    for e in episodes:
        out.add(e["split"], *episode_part(e["id"], episode_arrays(root, shards, e)))
    return out


def resumed_stats(target: Path, prog: Progress) -> StatsFields:
    """The statistics of the episodes an interrupted write finished: saved with its progress, or read back."""
    out = StatsFields()
    file = target / PROGRESS_NAME
    try:
        if prog.stats_log:
            out = read_log(target, prog.stats_log, where=str(file))
        elif prog.stats is not None:  # saved as JSON by an older episodepipes
            if not isinstance(prog.stats, dict):
                raise ValueError(f"{file}: stats should be an object, found {type(prog.stats).__name__}")
            out.add_fields(prog.stats, where=str(file))
        elif prog.episodes:
            log.info("%s has no statistics (an older episodepipes); reading them from the finished shards", file)
            out = recompute(target, prog.shards, prog.episodes)
    except ValueError as e:
        raise ValueError(f"{e}; the progress file is damaged: pass --overwrite to start over") from None
    return out


def add_stats(out: str | Path) -> dict[str, Any]:
    """Compute the statistics of a finished output from its shards, write them as its side file and rewrite its
    index atomically naming it.

    Returns the new index field. Only ``index.json`` and the side file are written (a v2 index keeps its
    columns), the side file first, with every other field as it was and in the writer's layout (sorted keys,
    compact), so a recomputed index equals one written with statistics.
    """
    root = Path(out)
    with write_lock(root):
        index = EpisodeIndex.open(root)
        data = index.data
        return rewrite_with_stats(root, index, recompute(root, data["shards"], data["episodes"]))


def rewrite_with_stats(root: Path, index: EpisodeIndex, stats: StatsFields) -> dict[str, Any]:
    """Write ``stats`` as ``root``'s side file, then its index naming it (every other field as it was); returns the
    new index field. The caller holds the write lock."""
    fields = stats.write(root / statsfile.NAME)
    base = index.meta if index.version == 2 else index.data
    new = dict({k: v for k, v in base.items() if k not in (STATS, MISSING, statsfile.FIELD)}, **fields)
    safefile.write_file(root / INDEX_NAME, json.dumps(new, sort_keys=True, separators=(",", ":")).encode())
    return fields
