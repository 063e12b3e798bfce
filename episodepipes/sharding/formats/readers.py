"""The format registry: a name per dataset layout, a factory ``root -> EpisodeReader`` and a detector.

To add your own layout, write a reader (see `episodepipes.sharding.episode`) and::

    register_format("mine", MyReader, detect=lambda root: (root / "mine.yaml").exists())

after which ``open_reader(src)`` and ``episodepipes-shard write --format mine`` use it. A CLI run is a
new process, so it finds such a format in one of two ways (see `load_format`):

- ``--format package.module:factory`` imports ``package.module`` and takes ``factory``: a `Format`, or
  a callable ``root -> EpisodeReader``;
- an installed package declares it in the ``episodepipes.formats`` entry-point group, e.g. in its
  ``pyproject.toml``: ``[project.entry-points."episodepipes.formats"] mine = "mypkg.reader:MyReader"``.

Both run code chosen by whoever types the command or installs the package; nothing read from a
dataset (SRC or an index) ever names a module to import.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from episodepipes.sharding.episode import EpisodeReader
from episodepipes.sharding.formats.raw import IMAGE_EXTS, VIDEO_EXTS, RawReader
from episodepipes.sharding.formats.zarr_reader import ZarrReader

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Format:
    """A registered layout; ``copies``: its factory takes ``copy=True`` (``write --codec copy``)."""

    name: str
    factory: Callable[[Path], EpisodeReader]
    detect: Callable[[Path], bool] | None = None
    copies: bool = False


def _lerobot(root: Path, **options: float | bool) -> EpisodeReader:
    try:  # imported on use: the LeRobot reader needs the optional `lerobot` extra (pyarrow, av)
        from episodepipes.sharding.formats.lerobot import LeRobotReader
    except ImportError as e:
        raise ValueError(f"the lerobot format needs its extra ({e}); pip install 'episodepipes[lerobot]'") from e
    return LeRobotReader(root, **options)  # options: tolerance_s (`write --tolerance-s`), copy (`--codec copy`)


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
                    detect: Callable[[Path], bool] | None = None, copies: bool = False) -> None:
    """Add (or replace) a format; ``detect`` lets ``--format auto`` recognise it, checked in registration order.

    Args:
        name: the ``--format`` name.
        factory: ``root -> EpisodeReader``, e.g. the reader class.
        detect: ``root -> bool``, True when ``root`` has this layout; None to be chosen by name only.
        copies: ``factory(root, copy=True)`` gives a reader that copies packets into `EpisodeData.packets`
            (and says so with ``copy = True``), for ``write --codec copy``.
    """
    FORMATS[name] = Format(name, factory, detect, copies)


register_format("lerobot", _lerobot, detect=_is_lerobot, copies=True)
register_format("zarr", ZarrReader, detect=_is_zarr)
register_format("raw", RawReader, detect=_is_raw, copies=True)


ENTRY_POINTS = "episodepipes.formats"
_TARGET = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")


def plugin_formats() -> list[str]:
    """Names declared by installed packages in the ``episodepipes.formats`` entry-point group (not loaded)."""
    return sorted({ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINTS)} - FORMATS.keys())


def _register_object(name: str, obj: object, where: str) -> None:
    if isinstance(obj, Format):
        register_format(name, obj.factory, detect=obj.detect, copies=obj.copies)
    elif callable(obj):
        register_format(name, obj)
    else:
        raise ValueError(f"--format {name}: {where} is a {type(obj).__name__}, not a Format or a callable "
                         "root -> EpisodeReader; point it at the reader class or a factory function")


def load_format(name: str) -> None:
    """Register ``name`` if it is an entry point of ``episodepipes.formats`` or a ``module:attribute`` target."""
    if name in FORMATS:
        return
    eps = [ep for ep in importlib.metadata.entry_points(group=ENTRY_POINTS) if ep.name == name]
    if eps:
        where = f"entry point {eps[0].value!r}"
        try:
            obj = eps[0].load()
        except Exception as e:  # the plugin's own import-time error, in one line
            raise ValueError(f"--format {name}: cannot load {where} ({type(e).__name__}: {e}); fix or reinstall "
                             "its package") from e
        _register_object(name, obj, where)
        return
    if ":" not in name:
        return
    if not _TARGET.fullmatch(name):
        raise ValueError(f"--format {name!r} is not module:factory; write e.g. --format mypkg.reader:MyReader")
    module, attr = name.split(":")
    try:
        obj: object = importlib.import_module(module)
    except Exception as e:  # ImportError, or the module's own import-time error, in one line
        raise ValueError(f"--format {name}: cannot import {module!r} ({type(e).__name__}: {e}); put its folder "
                         "on PYTHONPATH or install it") from e
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"--format {name}: module {module!r} has no {attr!r}; check the name after ':'")
        obj = getattr(obj, part)
    _register_object(name, obj, f"{name!r}")


def detect_format(src: Path) -> str:
    """The first registered format whose detector accepts ``src``; installed plugins are tried last."""
    for name in [None, *plugin_formats()]:
        if name is not None:
            try:
                load_format(name)
            except ValueError as e:  # a broken plugin must not break detection of the other formats
                log.warning("%s", e)
                continue
        for f in FORMATS.values():
            if f.detect is not None and f.detect(src):
                return f.name
    raise ValueError(f"cannot tell the format of {src}: expected <id>/ folders with videos, images or arrays.npz "
                     f"(raw), <id>.zarr groups (zarr) or meta/info.json (lerobot); pass --format "
                     f"{'|'.join(FORMATS)} or module:factory")


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
    load_format(fmt)
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose one of auto, {', '.join([*FORMATS, *plugin_formats()])}, "
                         "or module:factory")
    return root, fmt


def open_reader(src: str | Path, fmt: str = "auto") -> EpisodeReader:
    """The reader for ``src``.

    Args:
        src: the dataset folder.
        fmt: a registered name, an ``episodepipes.formats`` entry point, ``module:factory``, or "auto"
            to detect the layout.
    """
    root, name = resolve(src, fmt)
    return FORMATS[name].factory(root)
