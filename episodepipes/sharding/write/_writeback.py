"""Start writing a file's dirty pages to disk without waiting, so a later fsync has little left.

A shard is fsynced before it takes its final name. Without early writeback the kernel holds the
whole shard (up to ``--shard-size``) in memory until then, and the writer waits for all of it at
once: at the end of a run nothing overlaps that wait.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

_SYNC_FILE_RANGE_WRITE = 2  # start writeback of dirty pages in the range; do not wait for it


def _load():  # noqa: ANN202 - the libc function, or None
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    return fn


_sync_file_range = _load()


def start_writeback(fd: int, offset: int, length: int) -> None:
    """Ask the kernel to begin writing ``length`` bytes at ``offset`` of ``fd``; a no-op off Linux.

    Failure is ignored: this only moves work earlier, and the fsync that follows still reports errors.
    """
    if _sync_file_range is not None and length > 0:
        _sync_file_range(fd, offset, length, _SYNC_FILE_RANGE_WRITE)
