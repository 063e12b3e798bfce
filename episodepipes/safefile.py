"""Creating files inside a dataset or output folder without following anything a stranger planted there.

A dataset folder may arrive as a tarball from anyone, so a name we write to (a lock, a ``.tmp``, an index column,
a video) may already be a symlink to a file outside it, a FIFO that blocks an open forever, or a device. Every
writer creates its files through this module: a new file is made with ``O_CREAT | O_EXCL | O_NOFOLLOW`` (a leftover
regular file of a crashed run is removed first; removing a link never touches its target), a file that is kept
open across runs (a lock, an append-only log) is opened with ``O_NOFOLLOW | O_NONBLOCK`` and must be a regular
file. Anything else is `UnsafePathError`, naming the path. Final names are given with ``os.replace``, which
replaces a link itself, never its target.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from episodepipes.errors import UnsafePathError  # noqa: F401 (re-export)

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symlink"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a device or special file"


def _clear_stale(path: Path) -> None:
    """Remove a leftover regular file at ``path``; refuse anything else that is there."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode):
        raise UnsafePathError(path, _kind(st.st_mode))
    os.unlink(path)


def create(path: str | os.PathLike, *, replace: bool = True, mode: int = 0o644) -> int:
    """A write-only descriptor of a new regular file at ``path``. An existing regular file there is removed first
    when ``replace`` (a crashed run's leftover temp file), else `FileExistsError`; a link, FIFO, device or folder
    there is `UnsafePathError`. Never follows a link, even one planted between the check and the create."""
    path = Path(path)
    if replace:
        _clear_stale(path)
    try:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, mode)
    except FileExistsError:
        st = os.lstat(path)
        if stat.S_ISREG(st.st_mode) and not replace:
            raise
        raise UnsafePathError(path, _kind(st.st_mode) if not stat.S_ISREG(st.st_mode)
                              else "a file that appeared while it was being created") from None


def open_new(path: str | os.PathLike, *, replace: bool = True, mode: int = 0o644) -> BinaryIO:
    """`create` as a binary file object (``"wb"``)."""
    return os.fdopen(create(path, replace=replace, mode=mode), "wb")


def open_kept(path: str | os.PathLike, flags: int, *, mode: int = 0o644) -> int:
    """A descriptor of a file kept across runs (a lock, an append-only log), created if missing: ``flags`` are the
    access flags (``os.O_RDWR``, ``os.O_WRONLY | os.O_APPEND``, ...). A link there is refused (``O_NOFOLLOW``), a
    FIFO or device too (opened without blocking, then checked); the descriptor is blocking again when returned."""
    try:
        fd = os.open(path, flags | os.O_CREAT | _NOFOLLOW | _NONBLOCK | _CLOEXEC, mode)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.EMLINK, errno.ENXIO, errno.EISDIR):
            st = os.lstat(path)
            raise UnsafePathError(path, _kind(st.st_mode)) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePathError(path, _kind(st.st_mode))
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def make_dir(path: str | os.PathLike, *, parents: bool = False) -> Path:
    """``path`` as a real folder (made if missing); a link or file in its place is `UnsafePathError`. Folders a
    command makes inside a dataset (staging, job outputs) go through this, so a planted link cannot redirect
    every file written under it."""
    path = Path(path)
    path.mkdir(parents=parents, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePathError(path, _kind(st.st_mode))
    return path


def write_files(files: list[tuple[Path, bytes]]) -> None:
    """Write each file to ``<name>.tmp``, fsync them all, then give each its name, in order: every file is durable
    before any is renamed, so the last one (an index) never names files that a crash could lose. The data of all
    of them is written before the first fsync, so the disk flushes them together. A leftover ``.tmp`` of a crashed
    run is replaced; a link or special file at a temp name is refused, so nothing outside the folder is written."""
    tmps = [path.with_name(path.name + ".tmp") for path, _ in files]
    made: list[Path] = []
    try:
        with contextlib.ExitStack() as stack:
            opened = []
            for tmp, (_, data) in zip(tmps, files):
                f = stack.enter_context(open_new(tmp))
                made.append(tmp)
                f.write(data)
                f.flush()
                opened.append(f)
            for f in opened:
                os.fsync(f.fileno())
    except BaseException:  # a refused or failed temp name: the ones made before it hold space and no meaning
        for tmp in made:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        raise
    for tmp, (path, _) in zip(tmps, files):
        os.replace(tmp, path)


def write_file(path: Path, data: bytes) -> None:
    """`write_files` of one file."""
    write_files([(path, data)])


@contextlib.contextmanager
def replacing(path: Path, *, suffix: str = ".tmp") -> Iterator[BinaryIO]:
    """A new temp file beside ``path`` to stream into; fsynced and renamed to ``path`` when the block ends without
    an error, removed when it raises."""
    tmp = path.with_name(path.name + suffix)
    f = open_new(tmp)
    try:
        with f:
            yield f
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    os.replace(tmp, path)
