"""An index v2's column files, mapped (a local folder) or read (a remote root), each checked against what the JSON
part declares before anything is derived from it. A remote root's per-frame columns are not downloaded at open:
their header and size are checked from one GET of their first bytes, and their rows are read by range on use
(`episodepipes.remote.framecolumns`), so opening costs what grows with episodes, not frames.

A column's ``.npy`` header says how many rows it holds, and a sparse file can say 2**31 rows at no disk cost, so the
header is read first and must give the dtype and shape the checked JSON gives (`indexv2.check_meta` bounds those by
the episodes, shards and frames it lists), and the file's real size must be exactly header and data, before the
column is mapped or read. A local column is mapped through one per-process cache keyed by the file's identity
(device, inode, size, mtime): a mapping holds a file descriptor until the last array over it is gone, so an index
that only the cyclic GC would free (or a pipe built from a path on every pass) reuses the open mapping instead of
holding another descriptor per open.
"""

from __future__ import annotations

import io
import mmap
import os
import threading
import weakref
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from numpy.lib import format as npy

try:
    from numpy.lib.array_utils import byte_bounds
except ImportError:  # numpy < 2
    from numpy import byte_bounds  # type: ignore[attr-defined,no-redef]

from episodepipes.format import COLUMNS
from episodepipes.index.check import IndexFormatError, check_memory
from episodepipes.shardio import ByteSource, ShardMissingError, ShardTooLargeError

NPY_HEADER = 1 << 16  # above any .npy header numpy writes for a column's dtype and shape (a version 1.0 header)
_MAPS: weakref.WeakValueDictionary[tuple[int, int, int, int], mmap.mmap] = weakref.WeakValueDictionary()
_MAPS_LOCK = threading.Lock()


def header(raw: bytes | memoryview, where: str, file: str, dtype: str, shape: tuple[int, ...]) -> int:
    """The byte the data of the .npy bytes ``raw`` starts at, once its header is the ``dtype`` and ``shape``
    ``file`` declares (C order); an `IndexFormatError` naming ``where`` otherwise."""
    buf = io.BytesIO(bytes(raw[:NPY_HEADER]))
    try:
        version = npy.read_magic(buf)
        if version not in ((1, 0), (2, 0)):
            raise ValueError(f".npy version {version} is not one episodepipes writes")
        read = npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0
        got, fortran, dt = read(buf)
        if dt.hasobject:
            raise ValueError("it holds Python objects, a pickle, which is never loaded")
    except (ValueError, OSError, EOFError, SyntaxError, TypeError) as e:  # not .npy, cut short, a crafted header
        raise IndexFormatError(f"{where} is not a {dtype} column of shape {list(shape)} ({e}); "
                               "restore it or re-shard") from None
    if dt.str != dtype or tuple(got) != shape or fortran:
        raise IndexFormatError(f"{where} holds {dt.str} {list(got)}, {file} says {dtype} {list(shape)}; "
                               "restore it or re-shard")
    return buf.tell()


def _nbytes(dtype: str, shape: tuple[int, ...]) -> int:
    return int(np.prod(shape, dtype=object)) * np.dtype(dtype).itemsize


def _size_mismatch(where: str, size: int, start: int, dtype: str, shape: tuple[int, ...], file: str) -> None:
    want = start + _nbytes(dtype, shape)
    if size != want:
        raise IndexFormatError(f"{where} holds {size} bytes: it is not a {dtype} column of shape {list(shape)}, what "
                               f"{file} says, which takes {want} with its header; restore it or re-shard")


def _mapping(path: Path, missing: str) -> mmap.mmap:
    """The read-only mapping of ``path``, shared by every index of this process that maps the same file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO planted since `regular_file` looked does not block
    except FileNotFoundError:
        raise IndexFormatError(missing) from None
    try:
        st = os.fstat(fd)
        if st.st_size == 0:
            raise IndexFormatError(f"{path} is empty, not a column; restore it or re-shard")
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        with _MAPS_LOCK:
            mm = _MAPS.get(key)
            if mm is None:
                mm = _MAPS[key] = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        return mm
    except (OSError, ValueError) as e:  # a folder or device in its place, no address space left
        raise IndexFormatError(f"{path} cannot be mapped ({e}); restore it or re-shard") from None
    finally:
        os.close(fd)


def load_columns(root: Path, data: dict, file: Path) -> dict[str, np.ndarray]:
    """Map each column (its fixed file name beside the index) once its header and size are what the JSON says."""
    out = {}
    for name, c in data["columns"].items():
        path, dtype, shape = root / COLUMNS[name][0], c["dtype"], tuple(c["shape"])
        mm = _mapping(path, f"{path} is missing, and {file} needs it; restore it or re-shard")
        start = header(memoryview(mm), str(path), str(file), dtype, shape)
        _size_mismatch(str(path), len(mm), start, dtype, shape, str(file))
        count = int(np.prod(shape, dtype=np.int64))
        out[name] = np.frombuffer(mm, dtype, count, start).reshape(shape) if count else np.zeros(shape, dtype)
    return out


PER_FRAME = ("offset", "size", "crc32", "member", "key")  # columns of one row per frame: read at random rows


def _mapping_of(arr: Any) -> mmap.mmap | None:
    """The mapping an array of `load_columns` is a view of, or None (a remote or built column)."""
    b = arr
    while b is not None and not isinstance(b, mmap.mmap):
        b = b.obj if isinstance(b, memoryview) else getattr(b, "base", None)
    return b


def advise(arrays: Iterable[Any], advice: str) -> None:
    """Tell the kernel how the mapped columns among ``arrays`` will be read: ``"random"`` (a lookup's few rows) or
    ``"normal"`` (a scan). Why: a fault on a mapped file reads around it (``read_ahead_kb`` of the device, up to
    megabytes), so a train batch's few hundred rows at random would each read megabytes of a cold per-frame column;
    at random, a fault reads its page. A hint: nothing read changes, and where the system has no ``madvise`` it is
    skipped."""
    code = getattr(mmap, "MADV_RANDOM" if advice == "random" else "MADV_NORMAL", None)
    for a in arrays:
        mm = _mapping_of(a)
        if mm is not None and code is not None and hasattr(mm, "madvise"):
            with _MAPS_LOCK:
                try:
                    mm.madvise(code)
                except (OSError, ValueError):  # a closed mapping, or a kernel without the advice
                    pass


def release(*arrays: Any) -> None:
    """Unmap from this process the pages of the mapped columns under ``arrays`` once a scan has read them
    (``madvise(MADV_DONTNEED)``). Why: a page of a mapped file counts as private memory of the only process that
    maps it once touched, so a check or plan that reads every row of a table a block at a time would otherwise
    keep all of it (100 MB at 10**6 episodes) in each process. The pages stay in the page cache, shared: a later
    read maps them again for a minor fault. Nothing else changes (the mapping is read-only); without ``madvise``
    it does nothing."""
    code = getattr(mmap, "MADV_DONTNEED", None)
    for a in arrays:
        mm = _mapping_of(a)
        if mm is None or code is None or not getattr(a, "size", 0) or not hasattr(mm, "madvise"):
            continue
        lo, hi = byte_bounds(a)
        base = np.frombuffer(mm, np.uint8, 1).ctypes.data
        start = (lo - base) // mmap.PAGESIZE * mmap.PAGESIZE
        end = min(-(-(hi - base) // mmap.PAGESIZE) * mmap.PAGESIZE, len(mm))
        if 0 <= start < end:
            try:
                mm.madvise(code, start, end - start)
            except (OSError, ValueError):  # a closed mapping
                pass


PREFETCH_GAP = 4  # pages between two wanted ones below which `prefetch` asks for them in one range


def prefetch(arrays: Iterable[Any], starts: np.ndarray, ends: np.ndarray) -> int:
    """Ask the kernel to read, all at once, the pages holding rows ``starts[i] .. ends[i]`` of each mapped
    one-dimensional column among ``arrays`` (``madvise(MADV_WILLNEED)``), before a lookup touches them. Why: the
    per-frame columns are read at random (`advise`), so each cold page a lookup faults on is one read waited for in
    turn; a batch's few hundred rows over a 10**8-row column are as many pages, and asked for together they are
    read concurrently. A remote root's range columns (`episodepipes.remote.framecolumns`) fetch the blocks of those
    rows in one round of GETs instead, where the checks that follow would fetch them one segment at a time. A hint:
    nothing read changes. Returns the ranges asked for, or blocks fetched (what a test counts)."""
    code = getattr(mmap, "MADV_WILLNEED", None)
    starts, ends = np.asarray(starts, np.int64).ravel(), np.asarray(ends, np.int64).ravel()
    if code is None or not len(starts):
        return 0
    asked = 0
    for a in arrays:
        ranged = getattr(a, "prefetch", None)  # a remote root's range column: its blocks fetched in one round
        if callable(ranged):
            asked += ranged(starts, ends)
            continue
        mm = _mapping_of(a)
        if mm is None or a.ndim != 1 or not a.size or not hasattr(mm, "madvise"):
            continue
        base = np.frombuffer(mm, np.uint8, 1).ctypes.data
        lo, page = byte_bounds(a)[0] - base, mmap.PAGESIZE
        s = np.clip(starts, 0, len(a) - 1)
        e = np.clip(np.maximum(ends, s + 1), 1, len(a))
        order = np.argsort(s, kind="stable")
        first = (lo + s[order] * a.itemsize) // page
        last = np.maximum.accumulate((lo + e[order] * a.itemsize - 1) // page)
        new = np.ones(len(first), bool)  # a range starts where its first page is past the ones before (and a gap)
        new[1:] = first[1:] > last[:-1] + PREFETCH_GAP
        at = np.flatnonzero(new)
        ends_at = np.append(at[1:], len(first)) - 1
        for p0, p1 in zip(first[at].tolist(), last[ends_at].tolist()):
            start, end = p0 * page, min((p1 + 1) * page, len(mm))
            if 0 <= start < end:
                try:
                    mm.madvise(code, start, end - start)
                    asked += 1
                except (OSError, ValueError):  # a closed mapping
                    pass
    return asked


def scanned(table: np.ndarray, rows: int) -> Iterator[tuple[int, np.ndarray]]:
    """(first row, block) of ``table``, ``rows`` rows at a time, each block's mapped pages released (`release`)
    once the caller is done with it (when the next is asked for, and after the last)."""
    for a in range(0, len(table), rows):
        blk = table[a:a + rows]
        yield a, blk
        release(blk)


@contextmanager
def scanning(arrays: Iterable[Any]) -> Iterator[None]:
    """Read-around back on the mapped per-frame columns among ``arrays`` while a scan reads them through (verify,
    upgrade, the v1 layout), then read at random again."""
    arrays = list(arrays)
    advise(arrays, "normal")
    try:
        yield
    finally:
        advise(arrays, "random")


PROBE = 4096  # bytes of a column's first GET: its header (128 bytes as numpy writes it), and its size alongside
_PER_INDEX = ("episodes", "segments")  # tables of rows per episode or per segment: read whole, whatever their count


def by_range(name: str, column: dict, data: dict) -> bool:
    """Whether a remote index's column is read by range on use (`episodepipes.remote.framecolumns`) rather than
    whole at open: a column of one row per frame (the packed layout's too: `indexv2.check_packed` checks them per
    segment on first use there)."""
    return name not in _PER_INDEX and data["frames"] > 0 and column["shape"][:1] == [data["frames"]]


def read_columns(source: ByteSource, data: dict, file: str) -> dict[str, Any]:
    """A remote root's columns, each checked as `load_columns` checks a mapped one (header, then the object's size).

    Per-frame columns (`by_range`) cost one GET at open, of their header and size, and become range columns that
    fetch the rows a lookup touches (each fetch checked again: the same bytes, the same object); the others (per
    episode or segment) are read whole, one GET each, what they take in memory together bounded before the first.
    """
    from episodepipes.remote import RemoteSource
    from episodepipes.remote.framecolumns import ColumnSpec, FrameColumns

    ranged = isinstance(source, RemoteSource)
    lazy = {n for n, c in data["columns"].items() if ranged and by_range(n, c, data)}
    check_memory(file, "its columns, read whole from a remote root,",
                 sum(NPY_HEADER + _nbytes(c["dtype"], tuple(c["shape"]))
                     for n, c in data["columns"].items() if n not in lazy))
    out: dict[str, Any] = {}
    specs = {}
    for name, c in data["columns"].items():
        col, dtype, shape = COLUMNS[name][0], c["dtype"], tuple(c["shape"])
        where, whole = f"{source.root}/{col}", NPY_HEADER + _nbytes(dtype, shape)
        try:
            if not ranged:
                raw = source.read_file(col, limit=whole)  # a larger one is not downloaded
                size = len(raw)
            else:  # one GET: the header (the whole column if it is read whole) and the object's size
                raw, size = source.probe(col, PROBE if name in lazy else whole)
                if name not in lazy and size > whole:
                    raise ShardTooLargeError(where, size, whole, "re-upload it or re-shard")
                if name in lazy and _header_end(raw) > len(raw) and size > len(raw):  # a longer header than numpy's
                    raw = source.read(col, 0, min(size, NPY_HEADER))
        except ShardMissingError:
            raise IndexFormatError(f"{where} is missing, and {file} needs it; upload it or re-shard") from None
        except ShardTooLargeError as e:
            raise IndexFormatError(str(e)) from None
        start = header(raw, where, file, dtype, shape)
        _size_mismatch(where, size, start, dtype, shape, file)
        if name in lazy:
            specs[name] = ColumnSpec(col, dtype, shape, start, bytes(raw[:start]))
        else:
            out[name] = np.frombuffer(raw, dtype, int(np.prod(shape, dtype=np.int64)), start).reshape(shape)
    if specs:
        source.pin({s.name: data["columns"][n]["sha256"] for n, s in specs.items()})  # cache entries keyed by it
        frames = FrameColumns(source, specs, file)
        out.update({n: frames.column(n) for n in specs})
    return out


def _header_end(raw: bytes) -> int:
    """Where a .npy header that starts ``raw`` says its data starts (0 if ``raw`` is too short to say)."""
    if len(raw) < 12 or raw[:6] != b"\x93NUMPY":
        return 0
    return 10 + int.from_bytes(raw[8:10], "little") if raw[6] == 1 else 12 + int.from_bytes(raw[8:12], "little")
