"""The records of ``_progress.log``: what one resume save appends, and reading them back.

A record is one line, ``<sha256> <payload bytes> <JSON>\\n``, then the payload: the JSON holds the new shards,
statistics records and episodes, the episodes without their per-frame values, which follow as little-endian columns
(every new frame's offset, then crc32, then in the packed layout head, size and key). The sha256 covers the JSON and
the payload. Encoding per-frame values as JSON numbers was most of a save's time; columns are copied as they are held
(`episodepipes.sharding.write.entries`). A line ``<sha256> <JSON>`` (no payload: the values inline, as the first
logs held them and as a writer without columns saves) is read too.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np

from episodepipes.sharding.write.entries import Entries

_DTYPES = {"offsets": "<u8", "crc32": "<u4", "heads": "<u4", "sizes": "<u4", "keys": "<u4"}


def record(shards: list[dict], episodes: list[dict] | Entries, first: int, stats_log: list,
           end: int | None = None) -> bytes:
    """The record of ``shards``, ``stats_log`` and the episodes of ``episodes`` numbered ``first`` to ``end`` (None:
    to the last)."""
    cols = episodes.columns_since(first, end) if isinstance(episodes, Entries) else None
    if cols is None:  # plain entries, or some without crc32 (an older write resumed): values inline
        text = json.dumps({"shards": shards, "episodes": episodes[first:end], "stats_log": stats_log},
                          sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(text).hexdigest().encode() + b" " + text + b"\n"
    lite, values = cols
    payload = b"".join(v.astype(_DTYPES[k], copy=False).tobytes() for k, v in values.items())
    text = json.dumps({"shards": shards, "episodes": lite, "stats_log": stats_log, "columns": list(values)},
                      sort_keys=True, separators=(",", ":")).encode()
    sha = hashlib.sha256(text)
    sha.update(payload)
    return sha.hexdigest().encode() + b" %d " % len(payload) + text + b"\n" + payload


def records(raw: bytes, where: str, fix: str, keys: tuple[str, ...]) -> dict[str, list]:
    """The ``keys`` lists of every record in ``raw``, joined, episodes whole; a record that fails its sha256 or
    does not hold what it says is refused naming ``where``, the record and ``fix``."""
    out: dict[str, list] = {k: [] for k in keys}
    pos, n = 0, 0
    while pos < len(raw):
        n += 1
        end = raw.find(b"\n", pos)
        head = raw[pos:len(raw) if end < 0 else end]
        sha, _, rest = head.partition(b" ")
        size, text = 0, rest
        if rest[:1].isdigit():  # a record with a payload
            count, _, text = rest.partition(b" ")
            size = int(count) if count.isdigit() and len(count) < 16 else -1
        payload = raw[end + 1:end + 1 + size] if end >= 0 and size > 0 else b""
        digest = hashlib.sha256(text)
        digest.update(payload)
        if end < 0 or size < 0 or len(payload) != size or digest.hexdigest().encode() != sha:
            raise ValueError(f"{where}: line {n} does not match its sha256 (the file changed); {fix}")
        pos = end + 1 + size
        try:
            rec = json.loads(text)
        except (ValueError, RecursionError) as e:
            raise ValueError(f"{where}: line {n} is damaged ({e}); {fix}") from None
        if type(rec) is not dict or any(type(rec.get(k)) is not list for k in keys):
            raise ValueError(f"{where}: line {n} should hold lists of shards, episodes and statistics records; {fix}")
        if size or "columns" in rec:
            _fill(rec, payload, f"{where}: line {n}", fix)
        for k in keys:
            out[k] += rec[k]
    return out


def _fill(rec: dict, payload: bytes, where: str, fix: str) -> None:
    """Put the payload's per-frame values back into the record's episodes' segments, as lists."""
    cols = rec.get("columns")
    try:
        segs = [s for e in rec["episodes"] for s in e["segments"]]
        counts = [s["count"] for s in segs]
        if type(cols) is not list or not cols or any(c not in _DTYPES for c in cols) or \
                any(type(c) is not int or c < 0 for c in counts):
            raise TypeError
    except (TypeError, KeyError):
        raise ValueError(f"{where} should list its columns and its episodes' segments with counts; {fix}") from None
    rows = sum(counts)
    if len(payload) != rows * sum(np.dtype(_DTYPES[c]).itemsize for c in cols):
        raise ValueError(f"{where}: its payload does not hold {rows} frames of {', '.join(cols)}; {fix}")
    at, values = 0, {}
    for c in cols:
        values[c] = np.frombuffer(payload, _DTYPES[c], rows, at)
        at += rows * values[c].itemsize
    row = 0
    for s, count in zip(segs, counts):
        for c in cols:
            s[c] = values[c][row:row + count].tolist()
        row += count
    del rec["columns"]
