"""An index v2's column files, mapped (a local folder) or read (a remote root), each checked against what the JSON
part declares before anything is derived from it.

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
from pathlib import Path

import numpy as np
from numpy.lib import format as npy

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


def read_columns(source: ByteSource, data: dict, file: str) -> dict[str, np.ndarray]:
    """Each column read whole through a remote root's byte source (one GET each), checked as `load_columns` does;
    what they would take in memory together is bounded before the first is downloaded."""
    check_memory(file, "its columns, read whole from a remote root,",
                 sum(NPY_HEADER + _nbytes(c["dtype"], tuple(c["shape"])) for c in data["columns"].values()))
    out = {}
    for name, c in data["columns"].items():
        col, dtype, shape = COLUMNS[name][0], c["dtype"], tuple(c["shape"])
        where = f"{source.root}/{col}"
        try:
            raw = source.read_file(col, limit=NPY_HEADER + _nbytes(dtype, shape))  # a larger one is not downloaded
        except ShardMissingError:
            raise IndexFormatError(f"{where} is missing, and {file} needs it; upload it or re-shard") from None
        except ShardTooLargeError as e:
            raise IndexFormatError(str(e)) from None
        start = header(raw, where, file, dtype, shape)
        _size_mismatch(where, len(raw), start, dtype, shape, file)
        out[name] = np.frombuffer(raw, dtype, int(np.prod(shape, dtype=np.int64)), start).reshape(shape)
    return out
