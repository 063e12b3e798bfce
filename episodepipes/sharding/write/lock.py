"""One writer per output folder: ``<folder>/_write.lock``, held with ``flock`` for the whole write.

The kernel drops an ``flock`` when its process dies, so a crashed writer never blocks the next run.
The file also names its holder (pid and host): a second writer is refused with that name, and a
file left by a dead process on this host is taken over with a warning. A file left by another host
is refused: ``flock`` is not shared between hosts on every network filesystem, so only the user can
tell whether that writer still runs.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
from collections.abc import Iterator
from pathlib import Path

from episodepipes import safefile
from episodepipes.errors import LockedError  # noqa: F401 (re-export)

log = logging.getLogger(__name__)

LOCK_NAME = "_write.lock"


def _holder(fd: int) -> dict:
    os.lseek(fd, 0, os.SEEK_SET)
    try:
        data = json.loads(os.read(fd, 4096) or b"{}")
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _alive(pid: object) -> bool:
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


@contextlib.contextmanager
def write_lock(folder: Path) -> Iterator[None]:
    """Hold ``folder/_write.lock`` (``folder`` must exist); raise `LockedError` naming the other writer."""
    path = folder / LOCK_NAME
    host = socket.gethostname()
    while True:
        fd = safefile.open_kept(path, os.O_RDWR)  # a planted link or FIFO is refused by name
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            other = _holder(fd)
            os.close(fd)
            raise LockedError(f"{folder} is being written by pid {other.get('pid', '?')} on host "
                              f"{other.get('host', '?')} ({path}); wait for it to finish, or stop it and "
                              "re-run to resume") from None
        try:  # the file may have been unlinked by its last holder between our open and our flock
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        old = _holder(fd)
        if old and old.get("host") != host:
            raise LockedError(f"{path} names pid {old.get('pid', '?')} on host {old.get('host', '?')}, "
                              "which this host cannot check; if no write runs there, delete the file and re-run")
    except BaseException:
        os.close(fd)
        raise
    if old:
        log.warning("%s: taking over the lock of pid %s on %s, which %s", path, old.get("pid"), host,
                    "is not writing" if _alive(old.get("pid")) else "is no longer running")
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": host}).encode(), 0)
        yield
    finally:  # unlink before the flock goes: a waiter that opened this inode re-checks it (above)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        os.close(fd)
