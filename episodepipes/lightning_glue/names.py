"""Names that become paths: video loader names (folders) and episode ids (file names) under the writer's dirpath.

A loader name is the user's, so an unusable one is refused when `ValLoaders` is built (not at the first
render on rank 0). An episode id is the dataset's: any id the index accepts must give a file name the
filesystem takes, so a long one is shortened with a hash of the full id (stable across runs and ranks).
"""

from __future__ import annotations

import hashlib
import re

from episodepipes.format import safe_episode_id

MAX_LOADER_NAME = 64
MAX_STEM = 120  # bytes; a file name is at most 255, and "_step00000000_validate.mp4" and ".partial" follow
_LOADER_NAME = re.compile(r"[A-Za-z0-9_\-][A-Za-z0-9_.\-]*")


def check_video_loader_name(name: object) -> str:
    """``name`` if it is usable as a folder name as it is, else a ValueError that says what is allowed.

    Allowed: 1 to 64 of ``A-Z a-z 0-9 _ - .``, not starting with ``.`` (so no ``..``, ``/``, NUL or hidden
    folder). Refusing rather than rewriting keeps the folder name equal to the loader name.
    """
    if not isinstance(name, str) or not _LOADER_NAME.fullmatch(name) or len(name) > MAX_LOADER_NAME:
        raise ValueError(f"video loader name {name!r} names its videos' folder: use 1-{MAX_LOADER_NAME} characters "
                         "of A-Z a-z 0-9 _ - . not starting with '.' (e.g. 'pinned')")
    return name


def check_folder_clash(names: list[str]) -> None:
    """Refuse two video loader names that one case-insensitive filesystem (macOS, Windows) takes as one folder."""
    seen: dict[str, str] = {}
    for n in names:
        other = seen.setdefault(n.casefold(), n)
        if other != n:
            raise ValueError(f"video loader names {other!r} and {n!r} would share one folder on a case-insensitive "
                             "filesystem; rename one")


def video_stem(episode_id: str) -> str:
    """A file-name stem for ``episode_id``: its tar-safe form, cut to `MAX_STEM` bytes with a hash suffix.

    The cut keeps the start of the id (recognisable in a listing) and appends 12 hex digits of the
    sha256 of the full id, so two long ids that share a prefix still get different files.
    """
    safe = safe_episode_id(episode_id)  # ASCII only, no separator, no leading dot
    if len(safe) <= MAX_STEM:
        return safe
    digest = hashlib.sha256(str(episode_id).encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"{safe[:MAX_STEM - 13]}-{digest}"
