"""`upgrade`: rewrite a shard folder's index as format v2, in place (the ``upgrade`` command).

Without ``crc`` no shard is read: the frames' offsets and sizes come from the v1 index, and frames that
had no crc32 there carry none (the index says ``"crc32": false``). With ``crc`` every shard is read once,
its sha256 checked against the index first (a checksum of damaged bytes would vouch for the damage), and
every frame gets its crc32. The columns are written first and ``index.json`` last, each atomically, so a
reader sees the old index or the new one; the shards are not touched, and the same v1 index always gives
the same bytes (those a v2 write of the same episodes gives). Statistics an older index kept in its JSON
move to the side file (`episodepipes.normstats.sidefile`), written before the index.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from episodepipes.index import EpisodeIndex, IndexFormatError
from episodepipes.index import v2 as indexv2
from episodepipes.index.shardread import chunks, digest
from episodepipes.index.v2 import COUNT, ROW, SHARD
from episodepipes.normstats import sidefile as statsfile
from episodepipes.normstats.fields import MISSING, STATS
from episodepipes.sharding.write.lock import write_lock

log = logging.getLogger(__name__)


def frame_crcs(index: EpisodeIndex) -> np.ndarray:
    """Every frame's crc32, read from the shards, each shard's size and sha256 checked against the index (before the
    crc32 are used); `ShardTruncatedError` naming a shard cut short while it is read."""
    out = np.zeros(index.frames, np.uint32)
    t = index.tables
    seg, off, size = t.segments, t.offset, t.size
    t.check_segments(range(len(seg)))
    for i, s in enumerate(index.shards):
        path = index.shard_path(i)
        if not path.exists():
            raise FileNotFoundError(f"shard {path} is missing; restore it before upgrade --crc, or upgrade without "
                                    "--crc")
        rows = [r for row, count in seg[seg[:, SHARD] == i][:, [ROW, COUNT]].tolist() for r in range(row, row + count)]
        sha, crcs = "", []  # read in checked chunks, not mapped (`index.shardread` says why)
        if path.stat().st_size == s.bytes:
            sha, crcs = digest(chunks(path, s.bytes), list(zip(off[rows].tolist(), size[rows].tolist())))
        if sha != s.sha256:
            raise IndexFormatError(f"shard {path} does not match the index (size or sha256); restore it, or "
                                   "upgrade without --crc (crc32 of changed bytes would vouch for them)")
        out[rows] = crcs
    return out


def upgrade(out: str | Path, *, crc: bool = False) -> EpisodeIndex:
    """Rewrite ``out``'s index as v2 (``crc``: reading the shards to add every frame's crc32), its statistics in
    the side file and its episode ids and attributes in columns (an older v2 index lists them in its JSON, which
    costs per episode at every open); returns it.

    Args:
        out: a finished shard folder.
        crc: read every shard to add the crc32 the index lacks (also on a v2 index without them).
    """
    out = Path(out)
    index = EpisodeIndex.open(out)
    if index.version == 2 and (index.has_crc or not crc) and STATS not in index.meta and "ids" not in index.meta:
        raise ValueError(f"{out / 'index.json'} is already version 2"
                         f"{'' if index.has_crc else ' (without crc32: pass --crc to add them)'}; nothing to do")
    crcs = frame_crcs(index) if crc else None
    data = index.data
    rest = {k: v for k, v in data.items() if k not in ("format", "version", "options", "shards", "episodes")}
    with write_lock(out):
        if STATS in rest:  # inline, as older episodepipes stored them: into the side file, written first
            table, missing = index.load_stats()
            rest = {k: v for k, v in rest.items() if k not in (STATS, MISSING)}
            rest.update(statsfile.write(out / statsfile.NAME, {at: table.get(at[1], split=at[0])
                                                              for at in table.keys()}, missing))
        meta, cols = indexv2.build(data["shards"], data["episodes"], data.get("options", {}), rest,
                                   offsets=index.tables.offset, crcs=crcs, layout=index.meta.get("layout", "members"))
        indexv2.write(out, meta, cols)
    log.info("upgraded %s to index version 2 (%s)", out, "crc32 per frame" if "crc32" in cols else "no crc32")
    return EpisodeIndex.open(out)
