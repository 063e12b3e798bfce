"""`Entries`: the index entries of a writer's finished episodes, their per-frame values held in numpy columns.

An entry's segments carry one value per frame (offset and crc32; in the packed layout also the record's head, size
and key frame). Held as Python lists, a frame cost ~80 bytes of ints and pointers, so a job of 10^8 frames held GBs
until its index was written. Here those values go into fixed-size numpy chunks (a chunk is never copied, and its
pages are resident only once written), and the entry keeps only its per-episode fields. Reading an entry (by
number, slice or iteration) gives it back whole, as the lists it was given, for the progress log and for tools;
`index_parts` hands the index build the columns as arrays, never as lists.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Iterator

import numpy as np

_FRAME_KEYS = ("offsets", "crc32", "heads", "sizes", "keys")  # a segment's per-frame lists
_CHUNK = 1 << 18  # values per chunk


class _Column:
    """One per-frame value of every finished episode, back to back, in chunks of ``_CHUNK``."""

    def __init__(self, dtype: type) -> None:
        self.dtype, self.chunks, self.size = np.dtype(dtype), [], 0

    def extend(self, values: np.ndarray) -> None:
        at = 0
        while at < len(values):
            used = self.size % _CHUNK
            if used == 0:
                self.chunks.append(np.empty(_CHUNK, self.dtype))
            n = min(_CHUNK - used, len(values) - at)
            self.chunks[-1][used:used + n] = values[at:at + n]
            at += n
            self.size += n

    def take(self, a: int, b: int) -> np.ndarray:
        """Values ``a:b`` (a view when they lie in one chunk)."""
        parts = []
        while a < b:
            c, o = divmod(a, _CHUNK)
            n = min(_CHUNK - o, b - a)
            parts.append(self.chunks[c][o:o + n])
            a += n
        if len(parts) == 1:
            return parts[0]
        return np.concatenate(parts) if parts else np.empty(0, self.dtype)


def _values(seg: dict, key: str, dtype: type, where: str) -> np.ndarray:
    try:
        v = np.asarray(seg[key], dtype)
    except (OverflowError, TypeError, ValueError):
        raise ValueError(f"{where}: a {key} value is not a whole number in 0..{np.iinfo(dtype).max} (a frame larger "
                         "than 4 GiB is more than an index holds); use smaller frames") from None
    if v.shape != (seg["count"],):
        raise ValueError(f"{where}: {key} holds {v.size} values for {seg['count']} frames")
    return v


class Entries:
    """The finished episodes' index entries, in output order; behaves as a read-only list of whole entries."""

    def __init__(self, packed: bool = False) -> None:
        self.packed = packed
        self._lite: list[dict] = []  # each entry without its segments' per-frame lists
        self._rows = array("Q", [0])  # first frame row of each entry, and one past the last
        self._no_crc: set[int] = set()  # entries whose segments had no crc32 (an older write resumed)
        self._shared: dict[str, object] = {}  # cameras and arrays of the entries by their JSON
        self._cols = {k: _Column(np.uint64 if k == "offsets" else np.uint32)
                      for k in (_FRAME_KEYS if packed else _FRAME_KEYS[:2])}

    def append(self, entry: dict) -> None:
        """Hold ``entry`` (segments with their per-frame lists, as `ShardWriter.add_frames` makes them)."""
        n = len(self._lite)
        segs, vals = [], {k: [] for k in self._cols}
        crc = all("crc32" in s for s in entry["segments"])
        for s in entry["segments"]:
            where = f"episode {entry['id']!r} segment {len(segs)}"
            for k, col in self._cols.items():
                if k != "crc32" or crc:
                    vals[k].append(_values(s, k, col.dtype.type, where))
            segs.append({k: v for k, v in s.items() if k not in _FRAME_KEYS})
        for k, col in self._cols.items():
            if vals[k]:
                col.extend(np.concatenate(vals[k]))
        rows = self._rows[-1] + sum(s["count"] for s in segs)
        if not crc:
            self._no_crc.add(n)
            self._cols["crc32"].extend(np.zeros(rows - self._rows[-1], np.uint32))  # rows stay aligned
        lite = dict(entry, segments=segs)
        for k in ("cameras", "arrays"):  # one object for equal schemas: an encoder process sends a copy with each
            if k in lite:
                lite[k] = self._shared.setdefault(json.dumps(lite[k], sort_keys=True), lite[k])
        self._lite.append(lite)
        self._rows.append(rows)

    def __len__(self) -> int:
        return len(self._lite)

    def __iter__(self) -> Iterator[dict]:
        return (self._whole(n) for n in range(len(self._lite)))

    def __getitem__(self, i: int | slice) -> dict | list[dict]:
        if isinstance(i, slice):
            return [self._whole(n) for n in range(*i.indices(len(self._lite)))]
        return self._whole(range(len(self._lite))[i])

    @property
    def frames(self) -> int:
        """Frames of all the entries."""
        return self._rows[-1]

    def lengths(self) -> Iterator[int]:
        return (e["length"] for e in self._lite)

    def _whole(self, n: int) -> dict:
        row, segs = self._rows[n], []
        for s in self._lite[n]["segments"]:
            seg = dict(s)
            for k, col in self._cols.items():
                if k != "crc32" or n not in self._no_crc:
                    seg[k] = col.take(row, row + s["count"]).tolist()
            segs.append(seg)
            row += s["count"]
        return dict(self._lite[n], segments=segs)

    def columns_since(self, n: int, end: int | None = None) -> tuple[list[dict], dict[str, np.ndarray]] | None:
        """Entries ``n:end`` (``end`` None: to the last) without their per-frame lists, and those values as columns
        (for a progress record); None if one of them has no crc32 (its segments say so only as lists)."""
        end = len(self._lite) if end is None else min(end, len(self._lite))
        if any(n <= k < end for k in list(self._no_crc)):  # a copy: a background save reads while the writer adds
            return None
        a, b = self._rows[min(n, end)], self._rows[end]
        return self._lite[n:end], {k: col.take(a, b) for k, col in self._cols.items()}

    def index_parts(self) -> tuple[list[dict], np.ndarray, np.ndarray | None]:
        """(entries, offsets, crc32s) for `episodepipes.index.v2.build`: the entries without per-frame lists (in the
        packed layout each segment's spans, heads, sizes and keys as array views), every offset and every crc32
        back to back (None if an entry has none: then no segment carries one, and the index has no crc32 column)."""
        frames = self.frames
        cols = {k: col.take(0, frames) for k, col in self._cols.items()}
        entries = self._lite
        if self.packed:
            entries, row = [], 0
            for e in self._lite:
                segs = []
                for s in e["segments"]:
                    b = row + s["count"]
                    segs.append(dict(s, **{k: cols[k][row:b] for k in ("offsets", "heads", "sizes", "keys")}))
                    row = b
                entries.append(dict(e, segments=segs))
        return entries, cols["offsets"], None if self._no_crc else cols["crc32"]
