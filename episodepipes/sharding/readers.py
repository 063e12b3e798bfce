"""The format registry: a name per dataset layout, a factory ``root -> EpisodeReader`` and a detector.

To add your own layout, write a reader (see `episodepipes.sharding.episode`) and::

    register_format("mine", MyReader, detect=lambda root: (root / "mine.yaml").exists())

after which ``open_reader(src)`` and ``episodepipes-shard write --format mine`` use it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from episodepipes.sharding.episode import EpisodeReader
from episodepipes.sharding.raw import IMAGE_EXTS, VIDEO_EXTS, RawReader
from episodepipes.sharding.zarr_reader import ZarrReader

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Format:
    name: str
    factory: Callable[[Path], EpisodeReader]
    detect: Callable[[Path], bool] | None = None


def _lerobot(root: Path, **options: float) -> EpisodeReader:
    try:  # imported on use: the LeRobot reader needs the optional `lerobot` extra (pyarrow, av)
        from episodepipes.sharding.lerobot import LeRobotReader
    except ImportError as e:
        raise ValueError(f"the lerobot format needs its extra ({e}); pip install 'episodepipes[lerobot]'") from e
    return LeRobotReader(root, **options)  # options: tolerance_s (`write --tolerance-s`)


def _is_lerobot(root: Path) -> bool:
    return (root / "meta" / "info.json").is_file()


def _is_zarr(root: Path) -> bool:
    return any(p.is_dir() and p.name.endswith(".zarr") for p in root.iterdir())


def _is_raw(root: Path) -> bool:
    for d in root.iterdir():
        if d.is_dir() and not d.name.startswith((".", "_")):
            for p in d.iterdir():
                if p.name == "arrays.npz" or (p.is_file() and p.suffix.lower() in VIDEO_EXTS):
                    return True
                if p.is_dir() and any(f.suffix.lower() in IMAGE_EXTS for f in p.iterdir()):
                    return True
    return False


FORMATS: dict[str, Format] = {}


def register_format(name: str, factory: Callable[[Path], EpisodeReader], *,
                    detect: Callable[[Path], bool] | None = None) -> None:
    """Add (or replace) a format; ``detect`` lets ``--format auto`` recognise it, checked in registration order."""
    FORMATS[name] = Format(name, factory, detect)


register_format("lerobot", _lerobot, detect=_is_lerobot)
register_format("zarr", ZarrReader, detect=_is_zarr)
register_format("raw", RawReader, detect=_is_raw)


def detect_format(src: Path) -> str:
    """The first registered format whose detector accepts ``src``."""
    for f in FORMATS.values():
        if f.detect is not None and f.detect(src):
            return f.name
    raise ValueError(f"cannot tell the format of {src}: expected <id>/ folders with videos, images or arrays.npz "
                     f"(raw), <id>.zarr groups (zarr) or meta/info.json (lerobot); pass --format "
                     f"{'|'.join(FORMATS)}")


def resolve(src: str | Path, fmt: str = "auto") -> tuple[Path, str]:
    """Check ``src`` and ``fmt``; returns the root and the concrete format name."""
    root = Path(src)
    if not root.exists():
        raise FileNotFoundError(f"source {root} does not exist; check the SRC path")
    if not root.is_dir():
        raise ValueError(f"source {root} is not a folder; SRC is the folder that holds the episodes")
    if fmt == "auto":
        fmt = detect_format(root)
        log.info("detected format %r for %s", fmt, root)
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose one of auto, {', '.join(FORMATS)}")
    return root, fmt


def open_reader(src: str | Path, fmt: str = "auto") -> EpisodeReader:
    """The reader for ``src``; ``fmt="auto"`` detects the layout."""
    root, name = resolve(src, fmt)
    return FORMATS[name].factory(root)
