"""The byte source: every read of a dataset's files (its index and shards) goes through one of these.

A source is opened on a dataset *root* chosen by the caller (a local folder today; an object-store
URL behind the same interface), and files are named relative to it. Names come from an index, which
may be hostile, so a source accepts only plain base names: nothing in a data file decides where or how
another file is opened. Sources own their handle cache and the "missing" / "truncated" errors.
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from episodepipes.errors import (  # noqa: F401 (re-export)
    ShardIOError,
    ShardMissingError,
    ShardTooLargeError,
    ShardTruncatedError,
)
from episodepipes.format import check_name  # noqa: F401 (re-export)

if TYPE_CHECKING:
    from .remote import RemoteOptions

def pread_exact(fd: int, size: int, offset: int, path: str | os.PathLike) -> bytes:
    """``size`` bytes of the file ``fd`` at ``offset``; `ShardTruncatedError` naming ``path`` where it holds fewer (a
    file cut short, possibly while it was read: the one check every checked read of a dataset's files makes)."""
    data = os.pread(fd, size, offset) if size > 0 else b""
    if len(data) != max(size, 0):
        raise truncated(path, offset + len(data), offset + size)
    return data


def truncated(path: str | os.PathLike, at: int, want: int) -> ShardTruncatedError:
    """The error of a read of ``path`` that ended at byte ``at`` where the index expects ``want``."""
    return ShardTruncatedError(f"{path} ends at byte {at}, the index expects {want} (truncated, or changed while it "
                               "was read?); restore it or re-shard, or check with verify")


def open_regular(path: str | os.PathLike, fix: str, error: type[Exception]) -> tuple[int, os.stat_result]:
    """A read-only descriptor of ``path`` and its stat, if it is a regular file (through links); otherwise ``error``
    naming it and ``fix``. Opened with O_NONBLOCK where the platform has it: opening a FIFO would otherwise wait for
    a writer forever, and a device such as /dev/zero never ends. A missing file raises FileNotFoundError."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise error(f"{path} is not a regular file (a folder, FIFO or device in its place); {fix}")
    except BaseException:
        os.close(fd)
        raise
    return fd, st


class ByteSource(Protocol):
    """Reads byte ranges of files under one dataset root. Thread-safe; `close` drops cached handles."""

    root: str

    def size(self, name: str) -> int:
        """The file's size in bytes; `ShardIOError` if it is missing."""
        ...

    def read(self, name: str, offset: int, size: int) -> bytes:
        """Exactly ``size`` bytes at ``offset``; `ShardIOError` naming the file and range if fewer exist."""
        ...

    def read_ranges(self, name: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """``read(name, offset, size)`` for each ``(offset, size)``; a remote source coalesces and overlaps them."""
        ...

    def read_many(self, calls: Sequence[tuple[str, Sequence[tuple[int, int]]]]) -> list[list[bytes]]:
        """`read_ranges` of each ``(name, ranges)``; a remote source has every object's GETs in flight together."""
        ...

    def read_file(self, name: str, *, limit: int | None = None) -> bytes:
        """The whole file (an index); one of more than ``limit`` bytes is refused by its size before it is read
        (`ShardTooLargeError`)."""
        ...

    def close(self) -> None:
        """Release handles and connections; the source stays usable and reopens them on demand."""
        ...


class LocalSource:
    """A local folder: one read-only descriptor per file, shared by threads through ``os.pread``. A name that is not
    a regular file (a FIFO, a device, a folder) is refused at its first use, naming it."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = str(root)
        self._fds: dict[str, int] = {}
        self._lock = threading.Lock()

    def _path(self, name: str) -> str:
        return os.path.join(self.root, check_name(name))

    def _fd(self, name: str) -> int:
        fd = self._fds.get(name)
        if fd is None:
            with self._lock:
                fd = self._fds.get(name)
                if fd is None:
                    path = self._path(name)
                    try:
                        fd, _ = open_regular(path, f"restore it or re-shard {self.root}", ShardIOError)
                    except FileNotFoundError:
                        raise ShardMissingError(f"{path} is missing; restore it or re-shard {self.root}") from None
                    self._fds[name] = fd
        return fd

    def size(self, name: str) -> int:
        return os.fstat(self._fd(name)).st_size

    def fileno(self, name: str) -> int:
        """The source's descriptor of the file (a regular file, checked at open; owned by the source)."""
        return self._fd(name)

    def read(self, name: str, offset: int, size: int) -> bytes:
        fd = self._fds.get(name)  # the common case, without a call: readers ask for every header of a frame
        return pread_exact(self._fd(name) if fd is None else fd, size, offset, self._path(name))

    def read_ranges(self, name: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        return [self.read(name, off, size) for off, size in ranges]

    def read_many(self, calls: Sequence[tuple[str, Sequence[tuple[int, int]]]]) -> list[list[bytes]]:
        return [self.read_ranges(name, ranges) for name, ranges in calls]

    def read_file(self, name: str, *, limit: int | None = None) -> bytes:
        size = self.size(name)
        if limit is not None and size > limit:
            raise ShardTooLargeError(self._path(name), size, limit, f"restore it or re-shard {self.root}")
        return self.read(name, 0, size)

    def close(self) -> None:
        with self._lock:
            fds, self._fds = self._fds, {}
        for fd in fds.values():
            os.close(fd)

    def __enter__(self) -> LocalSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"LocalSource({self.root!r})"


def is_url(root: str | os.PathLike) -> bool:
    """Whether a dataset root names a remote store (``scheme://...``) rather than a local folder."""
    s = str(root)
    return "://" in s and not s.startswith("file://")


def open_source(root: str | os.PathLike, *, options: RemoteOptions | None = None) -> ByteSource:
    """The byte source for a dataset root given by the caller.

    A local folder (or ``file://`` path) gives a `LocalSource`; an ``s3://``, ``gs://`` or ``http(s)://`` root
    gives a `RemoteSource` (``pip install 'episodepipes[remote]'``), read with ``options``, which a local
    root ignores. Opening connects to nothing: the first read does.
    """
    s = str(root)
    if is_url(s):
        from .remote import RemoteSource

        return RemoteSource(s, options)  # a missing remote extra: ModuleNotFoundError naming its pip install
    return LocalSource(Path(s.removeprefix("file://")))
