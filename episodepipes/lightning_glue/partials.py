"""Partial video files: one name per run, locked by the run writing them, removed only when provably abandoned.

Several runs may share a video folder (two experiments, a re-run of ``validate()``, a run on another host over NFS).
A partial file is therefore named ``.<stem>.run-<host>-<pid>-<nonce>.partial.mp4``: ``host`` is 8 hex digits of
the hash of the host name, ``pid`` the writing process, ``nonce`` random per writer. Its writer holds an exclusive
``flock`` on it for as long as it exists. A partial file is *abandoned*, and `remove_abandoned` deletes it, only when
all of these hold: its name has that form, the host is this one, no process with that pid is alive here, and no
process holds its lock (which also covers a run in another pid namespace under the same host name). Anything else,
including a partial file from another host or from an older version of this library, is left alone and counted.

Final names are never replaced: `publish` gives a finished file its name with ``link()`` (which fails on any
existing name, a planted symlink included), or, when that name is taken, the first free ``<stem>-v1.mp4``,
``-v2``... (as Lightning's ``ModelCheckpoint`` versions a taken checkpoint name).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import logging
import os
import re
import secrets
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)
PARTIAL = ".partial.mp4"
MAX_VERSIONS = 999  # -v1 ... -v999; past that the folder is a mess worth a clear error
_NAME = re.compile(r"\..+\.run-(?P<host>[0-9a-f]{8})-(?P<pid>[0-9]{1,10})-[0-9a-f]{8}" + re.escape(PARTIAL))
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def host_id() -> str:
    """8 hex digits naming this host in partial file names (a hash: host names may hold any character)."""
    return hashlib.sha256(socket.gethostname().encode("utf-8", "surrogatepass")).hexdigest()[:8]


def run_token() -> str:
    """A fresh ``run-<host>-<pid>-<nonce>`` token: every writer's partial files get names no other run uses."""
    return f"run-{host_id()}-{os.getpid()}-{secrets.token_hex(4)}"


def partial_path(path: Path, token: str) -> Path:
    """Where ``path``'s frames are written before `publish`, for the writer holding ``token``."""
    return path.with_name(f".{path.stem}.{token}{PARTIAL}")


def lock(fd: int) -> None:
    """Take the exclusive lock that marks a partial file as in use for as long as ``fd`` stays open."""
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True  # someone else's process, or a pid we cannot ask about: not provably dead
    return True


def abandoned(path: Path) -> bool:
    """True only when ``path`` is a partial file of a dead writer on this host, unlocked (see the module doc)."""
    m = _NAME.fullmatch(path.name)
    if m is None or m["host"] != host_id() or int(m["pid"]) in (0, os.getpid()) or _pid_alive(int(m["pid"])):
        return False
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False  # gone, a link, or unreadable: not ours to judge
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False  # locked: its writer is alive (in another pid namespace, say)
    finally:
        os.close(fd)
    return True


def remove_abandoned(folder: Path) -> int:
    """Delete the abandoned partial files in ``folder`` (a crashed run's); returns how many. Others stay."""
    removed = kept = 0
    for p in Path(folder).glob(f".*{PARTIAL}"):
        if abandoned(p):
            p.unlink(missing_ok=True)
            removed += 1
        else:
            kept += 1
    if removed:
        log.info("removed %d partial video file(s) left by a crashed run in %s", removed, folder)
    if kept:
        log.info("left %d partial video file(s) in %s alone: another run may still be writing them (a run on "
                 "another host, or one still alive here); delete them yourself once no run uses the folder",
                 kept, folder)
    return removed


def versions(path: Path) -> Iterator[Path]:
    """``path``, then ``<stem>-v1<suffix>`` ... ``-v999``: the names `publish` tries, in order (made lazily: almost
    always the first one is free)."""
    yield path
    for k in range(1, MAX_VERSIONS + 1):
        yield path.with_name(f"{path.stem}-v{k}{path.suffix}")


def publish(tmp: Path, path: Path) -> Path:
    """Give the finished file ``tmp`` the first free name of `versions` (never replacing one); returns it."""
    for name in versions(path):
        try:
            os.link(tmp, name, follow_symlinks=False)
        except FileExistsError:
            continue
        except OSError as e:
            if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK, errno.ENOSYS):
                raise
            if os.path.lexists(name):  # no hard links here (some FUSE and SMB mounts): check, then rename
                continue
            os.rename(tmp, name)
            return name
        os.unlink(tmp)
        return name
    raise FileExistsError(errno.EEXIST, f"{path.name} and its versions -v1 to -v{MAX_VERSIONS} all exist in "
                          f"{path.parent}; move old videos out of that folder", str(path))
