"""An index's per-frame columns under a remote root, read by range when a lookup needs them, never whole at open.

A remote index at 10^8 frames holds 1.7 GB of per-frame columns (offset, size, crc32, ...); reading them whole at
open would cost that in every process. Instead the index opens with their headers (checked by
`episodepipes.index.columns`), and each column here is a `RangeColumn`: an array-like that supports the indexing the
index and the pipes do (an int, a slice, an array of rows or a mask, then any further axes) and fetches only the
blocks of `BLOCK_ROWS` rows that a lookup touches. A block is fetched for every per-frame column at once (a frame's
lookup needs its offset, size and crc32 together: one round of GETs in flight, not three), and a process keeps at
most ``RemoteOptions.column_cache_bytes`` of blocks (least recently used dropped).

A block is checked as a mapped column is: exactly the bytes asked for, of the version whose header and size were
checked at open (every GET asks for the ETag seen then), so a column cut short or replaced since is refused by name
(`IndexFormatError`), never read as another file's rows. With ``cache_dir``, blocks are entries of the machine's
shared range cache (keyed by the column's sha256 in the index), so the ranks and workers of a node fetch each block
once; with ``cache_whole`` too, a column is fetched whole into that cache on first use (once per node) and mapped.

Pickled (into a spawned worker, with its index), a column carries its description, not its rows: the worker reads
what it touches, through the same cache.
"""

from __future__ import annotations

import collections
import mmap
import os
import threading
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import IndexFormatError, ShardTruncatedError
from . import retry
from .source import RemoteSource

BLOCK_ROWS = 8192  # rows per fetched block: 64 KiB of an 8-byte column, a small GET whose latency dominates
RECENT_ROWS = 1 << 16  # rows of recent many-row lookups kept (every column) for the single-row lookups that follow


@dataclass(frozen=True)
class ColumnSpec:
    """A per-frame column file as checked at open: its object ``name``, dtype, shape, the byte its rows start at,
    and its header bytes (a whole local copy must start with exactly these)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    head: bytes

    @property
    def row_bytes(self) -> int:
        return int(np.dtype(self.dtype).itemsize * np.prod(self.shape[1:], dtype=np.int64))


class FrameColumns:
    """The per-frame columns of one remote index: blocks of rows fetched together on use, a bounded cache of them.

    Args:
        source: the index's byte source (its connections, retries, cache and the versions `RemoteSource.probe` saw).
        specs: column name -> its file as checked at open; every column has the same rows.
        file: the index file, for messages.
    """

    def __init__(self, source: RemoteSource, specs: dict[str, ColumnSpec], file: str) -> None:
        self.source, self.specs, self.file = source, dict(specs), file
        self.rows = next(iter(specs.values())).shape[0] if specs else 0
        block_bytes = BLOCK_ROWS * max(1, sum(s.row_bytes for s in self.specs.values()))
        self.max_blocks = max(1, source.options.column_cache_bytes // block_bytes)
        self._blocks: collections.OrderedDict[int, dict[str, np.ndarray]] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._mapped: dict[str, np.ndarray] | None = None  # whole columns mapped from the node's cache
        # row -> (every column's values of the `take` that read it, its position there): a reader looks a batch's
        # rows up at once, then each sample's one by one; with more rows in flight than blocks in the cache (a full
        # shuffle of a large index) those blocks are gone by then, and each would cost a round trip again
        self._recent: collections.OrderedDict[int, tuple[dict[str, np.ndarray], int]] = collections.OrderedDict()
        self._tried_map = False
        _LIVE.add(self)

    def column(self, name: str) -> RangeColumn:
        """The array-like view of column ``name``."""
        return RangeColumn(self, name)

    def __reduce__(self) -> tuple:
        return FrameColumns, (self.source, self.specs, self.file)  # no rows: a copy reads what it touches

    # -- reads -------------------------------------------------------------------------------------------
    def span(self, name: str, a: int, b: int) -> np.ndarray:
        """Rows ``a .. b`` (``0 <= a <= b <= rows``) of column ``name``, read-only."""
        mapped = self._whole_mapped()
        if mapped is not None:
            return mapped[name][a:b]
        if a >= b:
            return self._empty(name, 0)
        hit = self._recent.get(a) if b == a + 1 else None
        if hit is not None:
            out = hit[0][name][hit[1]:hit[1] + 1]
            out.flags.writeable = False
            return out
        k0, k1 = a // BLOCK_ROWS, (b - 1) // BLOCK_ROWS
        blocks = self._get(range(k0, k1 + 1))
        parts = [blocks[k][name] for k in range(k0, k1 + 1)]
        out = parts[0] if len(parts) == 1 else np.concatenate(parts)
        out = out[a - k0 * BLOCK_ROWS: b - k0 * BLOCK_ROWS]
        out.flags.writeable = False
        return out

    def take(self, name: str, rows: np.ndarray) -> np.ndarray:
        """Column ``name`` at ``rows`` (a 1-D array of row numbers in range, any order), as a new array."""
        mapped = self._whole_mapped()
        if mapped is not None:
            return mapped[name][rows]
        if not len(rows):
            return self._empty(name, 0)
        keep = len(rows) <= RECENT_ROWS // 4  # a batch's rows, not a plan's: kept for its samples' lookups
        hits = [self._recent.get(r) for r in rows.tolist()] if keep else []
        if keep and all(h is not None for h in hits):  # another column of the same rows (size after offset)
            out1 = self._empty(name, len(rows))
            for i, (vals, j) in enumerate(hits):  # type: ignore[misc]
                out1[i] = vals[name][j]
            return out1
        ks = rows // BLOCK_ROWS
        order = np.argsort(ks, kind="stable")
        sk = ks[order]
        uniq, at = np.unique(sk, return_index=True)
        blocks = self._get(uniq.tolist())
        out = {n: self._empty(n, len(rows)) for n in (self.specs if keep else (name,))}
        for k, i, j in zip(uniq.tolist(), at.tolist(), [*at[1:].tolist(), len(sk)]):
            pick = order[i:j]
            for n, col in out.items():
                col[pick] = blocks[k][n][rows[pick] - k * BLOCK_ROWS]
        if keep:
            with self._lock:
                for i, r in enumerate(rows.tolist()):
                    self._recent[r] = (out, i)
                    self._recent.move_to_end(r)
                while len(self._recent) > RECENT_ROWS:
                    self._recent.popitem(last=False)
            return out[name].copy()  # the kept values stay as read, whatever the caller does with its array
        return out[name]

    def prefetch(self, starts: np.ndarray, ends: np.ndarray) -> int:
        """Fetch, in one round of GETs, the blocks holding rows ``starts[i] .. ends[i]`` (as many as the cache
        holds), so the lookups that follow (a batch's segments checked one at a time) find them cached instead of
        each costing a round trip; the blocks fetched (0 when mapped or all cached)."""
        if self._whole_mapped() is not None or not len(starts):
            return 0
        s = np.clip(np.asarray(starts, np.int64), 0, max(self.rows - 1, 0))
        e = np.clip(np.maximum(np.asarray(ends, np.int64), s + 1), 1, self.rows)
        ks: list[int] = []
        for a, b in zip((s // BLOCK_ROWS).tolist(), ((e - 1) // BLOCK_ROWS).tolist()):
            ks.extend(range(a, b + 1))
            if len(ks) >= self.max_blocks:
                break
        ks = list(dict.fromkeys(ks))[:self.max_blocks]
        with self._lock:
            todo = [k for k in ks if k not in self._blocks]
        if todo:
            self._get(ks)
        return len(todo)

    def whole(self, name: str) -> np.ndarray:
        """The whole column (for a caller that needs every row, as verify does): mapped from the node's cache with
        ``cache_whole``, otherwise fetched (not kept: it would evict every block)."""
        mapped = self._whole_mapped()
        if mapped is not None:
            return mapped[name]
        spec = self.specs[name]
        n = self.rows * spec.row_bytes
        [[raw]] = self._read([(spec.name, [(spec.start, n)])])
        out = np.frombuffer(raw, spec.dtype).reshape(spec.shape)
        return out

    # -- internals ---------------------------------------------------------------------------------------
    def _empty(self, name: str, n: int) -> np.ndarray:
        spec = self.specs[name]
        return np.empty((n, *spec.shape[1:]), spec.dtype)

    def _get(self, ks: Any) -> dict[int, dict[str, np.ndarray]]:
        """Blocks ``ks`` of every column, from the cache or fetched together (one `read_many`: all in flight)."""
        out, todo = {}, []
        with self._lock:
            for k in ks:
                b = self._blocks.get(k)
                if b is None:
                    todo.append(k)
                else:
                    self._blocks.move_to_end(k)
                    out[k] = b
        if todo:
            calls = []
            for spec in self.specs.values():
                rb = spec.row_bytes
                calls.append((spec.name, [(spec.start + k * BLOCK_ROWS * rb,
                                           (min(self.rows, (k + 1) * BLOCK_ROWS) - k * BLOCK_ROWS) * rb)
                                          for k in todo]))
            got = self._read(calls)
            for i, k in enumerate(todo):
                out[k] = {name: np.frombuffer(got[c][i], spec.dtype).reshape(-1, *spec.shape[1:])
                          for c, (name, spec) in enumerate(self.specs.items())}
            with self._lock:
                for k in todo:
                    self._blocks[k] = out[k]
                while len(self._blocks) > self.max_blocks:
                    self._blocks.popitem(last=False)
        return out

    def _read(self, calls: list[tuple[str, list[tuple[int, int]]]]) -> list[list[bytes]]:
        try:
            got = self.source.read_many(calls)
        except (ShardTruncatedError, retry.Changed) as e:
            raise IndexFormatError(f"{e} (a column of {self.file}, checked when it was opened: it was cut short or "
                                   "replaced since; reopen the index, or restore the column or re-shard)") from None
        for (name, ranges), pieces in zip(calls, got):
            for (off, n), piece in zip(ranges, pieces):
                if len(piece) != n:  # a cache entry or a body of another length: never reinterpreted
                    raise IndexFormatError(f"{self.source.root}/{name} bytes {off}-{off + n}: read {len(piece)} "
                                           f"bytes, a column of {self.file}; restore it or re-shard")
        return got

    def _whole_mapped(self) -> dict[str, np.ndarray] | None:
        """Every column mapped from the node's cache (``cache_whole``), fetched there first; None without it."""
        if self._tried_map:
            return self._mapped
        with self._lock:
            if not self._tried_map:
                self._mapped = self._map_all()
                self._tried_map = True
        return self._mapped

    def _map_all(self) -> dict[str, np.ndarray] | None:
        out = {}
        for name, spec in self.specs.items():
            path = self.source.local_copy(spec.name)
            if path is None:
                return None
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else None
            want = spec.start + self.rows * spec.row_bytes
            if mm is None or size != want or mm[:spec.start] != spec.head:  # checked as at open: header and size
                raise IndexFormatError(f"{path}, the cached copy of {self.source.root}/{spec.name} (a column of "
                                       f"{self.file}), holds {size} bytes or another header than the {want} checked "
                                       "at open; delete it from the cache_dir and reopen the index")
            out[name] = np.frombuffer(mm, spec.dtype, int(np.prod(spec.shape, dtype=np.int64)),
                                      spec.start).reshape(spec.shape)
        return out


class RangeColumn:
    """One per-frame column of a remote index, read by range on use (see the module): ``col[row]``, ``col[a:b]``,
    ``col[rows]`` (ints or a mask), with further axes after a comma, give what numpy gives for the same key on the
    whole array; ``np.asarray(col)`` (or `astype`) reads the whole column. Results are read-only or new arrays."""

    def __init__(self, frames: FrameColumns, name: str) -> None:
        self._frames, self._name = frames, name
        spec = frames.specs[name]
        self.dtype = np.dtype(spec.dtype)
        self.shape: tuple[int, ...] = spec.shape
        self.ndim = len(spec.shape)
        self.size = int(np.prod(spec.shape, dtype=np.int64))

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, key: Any) -> Any:
        rest: tuple = ()
        if isinstance(key, tuple):
            key, rest = (key[0], key[1:]) if key else (slice(None), ())
        n, f = self.shape[0], self._frames
        if key is Ellipsis:
            return np.asarray(self)[(Ellipsis, *rest)]
        if isinstance(key, int | np.integer) and not isinstance(key, bool | np.bool_):
            r = int(key) + (n if int(key) < 0 else 0)
            if not 0 <= r < n:
                raise IndexError(f"index {int(key)} is out of bounds for axis 0 with size {n}")
            row = f.span(self._name, r, r + 1)[0]
            return row[rest] if rest else row
        if isinstance(key, slice):
            a, b, step = key.indices(n)
            out = f.span(self._name, a, max(a, b)) if step == 1 else f.take(self._name, np.arange(a, b, step))
        else:
            rows = np.asarray(key)
            if rows.dtype == np.bool_:
                if rows.shape != (n,):
                    raise IndexError(f"boolean index of shape {rows.shape} does not match a column of {n} rows")
                rows = np.flatnonzero(rows)
            elif rows.dtype.kind not in "iu":
                raise IndexError(f"a column takes integer rows, slices or a mask, not {rows.dtype} {key!r:.60}")
            flat = rows.ravel().astype(np.int64)
            if (flat >= n).any() or (flat < -n).any():
                bad = int(flat[(flat >= n) | (flat < -n)][0])
                raise IndexError(f"index {bad} is out of bounds for axis 0 with size {n}")
            flat = np.where(flat < 0, flat + n, flat)
            out = f.take(self._name, flat).reshape(*rows.shape, *self.shape[1:])
        return out[(slice(None),) * (out.ndim - self.ndim + 1) + rest] if rest else out

    def prefetch(self, starts: np.ndarray, ends: np.ndarray) -> int:
        """`FrameColumns.prefetch`: the blocks of rows ``starts[i] .. ends[i]`` of every column, in one round."""
        return self._frames.prefetch(starts, ends)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = self._frames.whole(self._name)
        return out if dtype is None else out.astype(dtype)

    def astype(self, dtype: Any, copy: bool = True) -> np.ndarray:
        """The whole column as ``dtype`` (read whole, as `np.asarray` does)."""
        return np.asarray(self).astype(dtype)

    def tolist(self) -> list:
        return np.asarray(self).tolist()

    def __iter__(self) -> Any:
        return iter(np.asarray(self))

    def __reduce__(self) -> tuple:
        return RangeColumn, (self._frames, self._name)

    def __repr__(self) -> str:
        spec = self._frames.specs[self._name]
        return f"RangeColumn({self._frames.source.root}/{spec.name}, {spec.dtype}, shape={list(spec.shape)})"


_LIVE: weakref.WeakSet[FrameColumns] = weakref.WeakSet()


def _after_fork() -> None:
    # a forked worker keeps the blocks it inherited (no request to read them again); a lock another thread held at
    # the fork would never be released in the child
    for cols in list(_LIVE):
        cols._lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)
