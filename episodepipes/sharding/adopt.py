"""The default merge: K jobs' shards adopted into OUT by rename (no byte copied), the index joined from their columns.

Each job's shards keep their bytes, so every frame keeps its offset, size and crc32: only the shard numbers (and
the frame, segment and code numbers of the per-episode tables) move. The merged index is the jobs' columns
concatenated with numpy, streamed from their memory maps chunk by chunk, so a merge of 10^8 frames holds a few
chunks and the per-episode tables in memory, never a per-frame Python object.

Crash safety: the renames are planned in full and written to ``OUT/_merge.journal.json`` before the first one. A
merge interrupted anywhere is finished by re-running it: the jobs' indexes are still in ``_jobs`` (they go last),
the plan made from them again must equal the journal, and each rename is done unless its shard is already at its
new name with its recorded size. The index is written after every rename, last and atomically; then ``_jobs`` and
the journal go. Shards end where each job ended them, so the shard boundaries (not the frames) differ from a
single-job write; ``merge --repack`` gives those byte for byte.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from episodepipes import safefile
from episodepipes.format import COLUMNS, FORMAT_NAME, shard_name
from episodepipes.index import EpisodeIndex
from episodepipes.index import v2 as indexv2
from episodepipes.index.load import read_regular
from episodepipes.index.v2 import FIRST, FPS, PROMPT, ROW, SCHEMA, SEGMENT, SHARD, SPLIT
from episodepipes.sharding.write.progress import JOBS_DIR

log = logging.getLogger(__name__)

JOURNAL = "_merge.journal.json"
_CHUNK = 1 << 22  # frame rows copied at a time (32 MB of an 8-byte column)
_FRAME_COLUMNS = ("offset", "size", "crc32", "member", "key")  # per frame row; "key" holds rows too


def renames(jobs: list[tuple[Any, EpisodeIndex]]) -> list[list]:
    """``[source, merged name, bytes]`` of every job shard, in merged order (paths relative to OUT)."""
    out, n = [], 0
    for d, index in jobs:
        for s in index.shards:
            out.append([f"{JOBS_DIR}/{d.name}/{s.name}", shard_name(n), s.bytes])
            n += 1
    return out


def adopt(out: Path, jobs: list[tuple[Any, EpisodeIndex]], extra: dict, *,
          write_stats: Callable[[], dict]) -> dict:
    """Rename the jobs' shards into ``out`` (journaled), then write the joined index; returns its JSON part.

    ``extra`` holds the top-level fields the merged index adds (``skipped``); ``write_stats()`` writes the
    statistics side file into ``out`` and returns the index fields naming it (after the renames, before the index).
    """
    _check_joinable(jobs)
    plan = renames(jobs)
    journal = out / JOURNAL
    want = json.dumps({"renames": plan}, sort_keys=True).encode()
    if journal.exists():
        have = read_regular(journal, "delete it and re-run merge --repack", error=ValueError)
        if have != want:
            raise ValueError(f"{journal} records an interrupted merge of other job outputs than {out / JOBS_DIR} "
                             "holds now; re-run the jobs that changed with --overwrite, delete the journal and "
                             "the shard-*.tar files in OUT, then merge again")
        log.info("finishing the interrupted merge recorded in %s", journal)
    else:
        for src, _, size in plan:
            _check_size(out / src, size, f"job shard {src}")
        safefile.write_file(journal, want)
    for src, dst, size in plan:  # in order; a re-run skips what a killed run renamed
        s, d = out / src, out / dst
        if s.exists():
            _check_size(s, size, f"job shard {src}")
            os.replace(s, d)
        else:
            _check_size(d, size, f"shard {dst} (renamed from {src} by the interrupted merge)")
    _sync_dir(out)
    data, cols = join(jobs, {**extra, **write_stats()})
    write_index(out, data, cols)
    shutil.rmtree(out / JOBS_DIR)
    journal.unlink()
    return data


def _check_size(path: Path, size: int, what: str) -> None:
    try:
        have = os.lstat(path).st_size
    except FileNotFoundError:
        raise ValueError(f"{what} is missing ({path}); re-run its job with --overwrite, then merge") from None
    if have != size:
        raise ValueError(f"{what} has {have} bytes, its index says {size} ({path}); re-run its job with "
                         "--overwrite, then merge")


def _sync_dir(path: Path) -> None:
    """fsync a folder: its renames are durable before the index that names them is written."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _codes(values: list, key: Callable[[Any], str], table: dict[str, int], merged: list) -> np.ndarray:
    """Each of a job's code values as its code in the merged list (made here, first come first numbered)."""
    out = np.zeros(len(values), np.uint64)
    for i, v in enumerate(values):
        k = key(v)
        if k not in table:
            table[k] = len(merged)
            merged.append(v)
        out[i] = table[k]
    return out


def _check_joinable(jobs: list[tuple[Any, EpisodeIndex]]) -> str:
    """The jobs' one layout; jobs an in-place merge cannot join are refused before anything is renamed."""
    old = [d.name for d, index in jobs if index.version != 2]
    if old:
        raise ValueError(f"jobs {old} have version-1 indexes (an older episodepipes), whose columns an in-place merge "
                         "joins only in version 2; run episodepipes-shard upgrade on each job, or merge --repack")
    layouts = {index.meta["layout"] for _, index in jobs}
    if len(layouts) != 1:
        raise ValueError(f"the jobs hold shards of different layouts {sorted(layouts)}; re-run them with one --codec")
    return layouts.pop()


def join(jobs: list[tuple[Any, EpisodeIndex]], extra: dict) -> tuple[dict, dict[str, Any]]:
    """The merged index's JSON part (without ``columns``) and its columns: the per-episode and per-segment tables
    as arrays, and each per-frame column as the list of the jobs' arrays (with the row offset to add, for
    ``key``), concatenated only as `write_index` streams them."""
    layout = _check_joinable(jobs)
    crc = all(index.meta["crc32"] for _, index in jobs)
    merged: dict[str, list] = {"schemas": [], "splits": [], "prompts": [], "fps": []}
    tables: list[dict[str, int]] = [{}, {}, {}, {}]
    keys: list[Callable[[Any], str]] = [lambda s: json.dumps(s, sort_keys=True), str, str, json.dumps]
    eps, segs, frames, ids, attr, shards = [], [], {n: [] for n in _FRAME_COLUMNS}, [], [], []
    attrs: list[dict] = [{}]
    attr_codes: dict[str, int] = {"{}": 0}
    row = seg = 0
    for _, index in jobs:
        t, m, root = index.tables, index.meta, index.root
        e = np.array(t.episodes, np.uint64)
        s = np.array(t.segments, np.uint64)
        for col, (name, table, key) in zip((SCHEMA, SPLIT, PROMPT, FPS), zip(merged, tables, keys)):
            e[:, col] = _codes(m[name], key, table, merged[name])[e[:, col].astype(np.int64)]
        e[:, FIRST] += np.uint64(row)
        e[:, SEGMENT] += np.uint64(seg)
        s[:, SHARD] += np.uint64(len(shards))
        s[:, ROW] += np.uint64(row)
        eps.append(e)
        segs.append(s)
        for name in _FRAME_COLUMNS:
            if name in t.columns and (name != "crc32" or crc):
                frames[name].append((t.columns[name], row if name == "key" else 0, Path(root) / COLUMNS[name][0]))
        ids.append(np.asarray(t.ids))
        attr.append(_attr_codes(t.attr, t.attrs, attr_codes, attrs))
        base = len(shards)
        shards.extend({"name": shard_name(base + i), "bytes": x.bytes, "sha256": x.sha256, "samples": x.samples}
                      for i, x in enumerate(index.shards))
        row, seg = row + len(t.offset), seg + len(s)
    options = jobs[0][1].meta["options"]
    data = {"format": FORMAT_NAME, "version": 2, "layout": layout, "crc32": crc, "options": options,
            "shards": shards, **merged, "attrs": attrs, "frames": row, **extra}
    id_col = np.concatenate(ids) if any(len(i) for i in ids) else np.zeros(0, "S1")  # the widest job's width
    cols: dict[str, Any] = {"episodes": np.concatenate(eps).reshape(-1, 7), "segments": np.concatenate(segs)
                            .reshape(-1, 3), "ids": id_col,
                            "id_order": np.argsort(id_col, kind="stable").astype("<i8"),
                            "attr": np.concatenate(attr).astype("<u4")}
    cols.update({n: indexv2.Streamed((sum(len(a) for a, *_ in parts),), _column_chunks(parts, COLUMNS[n][1]))
                 for n, parts in frames.items() if parts})
    return data, cols


def _attr_codes(attr: np.ndarray, have: Sequence[dict], codes: dict[str, int], attrs: list[dict]) -> np.ndarray:
    """A job's ``attr`` column as codes into the merged ``attrs`` (extended here). Its sets are numbered in the order
    their first episodes come, as `episodepipes.index.idcols.build` numbers them in a single write of the same
    episodes, so the merged ``attrs`` and ``attr`` equal that write's."""
    used, first = np.unique(attr, return_index=True)
    to = np.zeros(len(have), np.uint32)
    for k in used[np.argsort(first, kind="stable")].tolist():
        key = json.dumps(have[k], sort_keys=True)
        if key not in codes:
            codes[key] = len(attrs)
            attrs.append(have[k])
        to[k] = codes[key]
    return to[np.asarray(attr, np.int64)]


def _data_offset(path: Path, arr: np.ndarray) -> int:
    """Where the data of the .npy ``path`` starts, its header checked to describe ``arr`` (its checked map)."""
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read(f)
        if shape != arr.shape or fortran or dtype != arr.dtype:
            raise ValueError(f"{path} changed since its index was opened; re-run that job with --overwrite")
        return f.tell()


def _column_chunks(parts: list[tuple[np.ndarray, int, Path]], dtype: str):  # noqa: ANN202 - yields bytes
    """A per-frame column's bytes, job after job, read from the files in chunks (not through the maps, whose
    touched pages would count in this process's memory until it exits: 1.6 GB at 10^8 frames)."""
    for arr, add, path in parts:
        at = _data_offset(path, arr) if len(arr) else 0
        for a in range(0, len(arr), _CHUNK):
            n = min(_CHUNK, len(arr) - a)
            chunk = np.fromfile(path, arr.dtype, n, offset=at + a * arr.itemsize)
            if len(chunk) != n:
                raise ValueError(f"{path} is shorter than its index says; re-run that job with --overwrite")
            chunk = chunk.astype(dtype, copy=False)
            if add:
                chunk = chunk + np.asarray(add, dtype)
            yield chunk.tobytes()


def write_index(out: Path, data: dict, cols: dict[str, Any]) -> bytes:
    """`episodepipes.index.v2.write` of what `join` gives (its per-frame columns streamed from the jobs' files, the
    rest written with ``index.json`` last and atomically); returns the index bytes."""
    return indexv2.write(out, data, cols)
