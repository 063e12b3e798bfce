"""Every public exception of episodepipes, in one module (the old homes re-export them, so both paths work).

Each message is one line naming the file, episode or option at fault and the fix. The hierarchy keeps the
built-in bases callers already catch: a missing shard is also a `FileNotFoundError`, a bad index a `ValueError`.
"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

__all__ = [
    "DiskFullError",
    "EpisodeError",
    "IndexFormatError",
    "LockedError",
    "ShardIOError",
    "ShardMissingError",
    "ShardTooLargeError",
    "ShardTruncatedError",
    "UnsafePathError",
    "WorkerError",
]


class IndexFormatError(ValueError):
    """An index that cannot be used; the message names the file, the field and the fix."""


class ShardIOError(OSError):
    """A file of the dataset is missing, shorter than the index says, or could not be read; names the file."""


class ShardMissingError(ShardIOError, FileNotFoundError):
    """The file is not there (also a `FileNotFoundError`, as the readers raised before the byte source)."""


class ShardTruncatedError(ShardIOError, ValueError):
    """The file ends before a range the index points at (also a `ValueError`: the data disagrees with its index)."""


class ShardTooLargeError(ShardIOError, ValueError):
    """A file read whole holds more bytes than its reader allows (``size``: what it holds); refused before reading."""

    def __init__(self, where: str, size: int, limit: int, fix: str) -> None:
        super().__init__(f"{where} holds {size} bytes, more than the {limit} expected; {fix}")
        self.size = size


class UnsafePathError(ValueError):
    """A name a command writes to is a symlink, FIFO, device or folder planted in its place; names the path."""

    def __init__(self, path: str | os.PathLike, what: str) -> None:
        super().__init__(f"{path} is {what}, not a regular file this command may write; remove it (nothing inside "
                         "a dataset folder should be a link or a special file) and re-run")
        self.path = Path(path)


class EpisodeError(ValueError):
    """Bad input in one episode; the message names the episode and the file. Always one line."""

    def __init__(self, message: object) -> None:
        super().__init__(re.sub(r"\s*\n\s*", " ", str(message)))


class LockedError(ValueError):
    """Another process writes the same folder."""


class DiskFullError(OSError):
    """The output's filesystem is full; the message says how much is kept and how to resume."""

    ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)  # EFBIG: a file size limit (a quota, RLIMIT_FSIZE)

    def __str__(self) -> str:
        return str(self.args[0])


class WorkerError(RuntimeError):
    """A decode worker died, or returned nothing within the bound (``STALL`` of the private decode executor): names
    the worker, and the pass ends. Or a shard writer's encoder process died: names the episodes in flight, and the
    write ends (a re-run resumes after the last finished shard)."""
