"""`ZarrReader`: one zarr group per episode, ``SRC/<episode_id>.zarr``.

Layout: ``images/<camera>`` uint8 (T, H, W, 3); any other array, at any depth, is per-step
(T, ...) and keeps its path as its name (``obs/state``); attrs ``fps``, ``prompt``, ``split``.
Other attrs that are JSON scalars are kept in `EpisodeData.extra` (episode attributes in the index, which
``where=`` sees); structured ones (lists, objects) and ones named like a built-in field (``length``) are
skipped with a log line. Each array is read with one ``[:]`` (one pass over its chunks), never
frame by frame, which on chunked, compressed stores is the difference between reading a chunk once and T times.

Arrays must hold numbers or booleans: text, bytes and object arrays are refused by name before they are
read. A store whose files or folders link outside SRC is refused, so zarr never opens a file outside it.
"""

from __future__ import annotations

import logging
import math
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from episodepipes.episode_attrs import BUILTIN
from episodepipes.index.check import memory_bound
from episodepipes.sharding.episode import (
    EpisodeData,
    EpisodeError,
    check_dtype,
    check_extra,
    check_fps,
    check_text,
    resolve_inside,
)

log = logging.getLogger(__name__)


def _zarr():  # noqa: ANN202 - the module, imported on use so zarr stays an optional extra
    try:
        import zarr
    except ImportError as e:
        raise ValueError("the zarr format needs the zarr package: pip install 'episodepipes[zarr]'") from e
    return zarr


@dataclass(frozen=True)
class ZarrImages:
    """A camera's frames: the whole array is read once, on first iteration, then yielded frame by frame."""

    store: Path
    key: str
    where: str

    def __iter__(self) -> Iterator[np.ndarray]:
        try:
            frames = _zarr().open_group(str(self.store), mode="r")[self.key][:]
        except Exception as e:  # zarr raises codec-, store- and json-specific errors for a damaged array
            raise EpisodeError(f"{self.where}: cannot read {self.store}/{self.key} ({e}); re-write that array, "
                               "or pass --skip-bad") from e
        if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3:
            raise EpisodeError(f"{self.where}: {self.store}/{self.key} is {frames.dtype} {frames.shape}; "
                               "images must be uint8 (T, H, W, 3) RGB")
        yield from frames


def _arrays(group: object, prefix: str = "") -> Iterator[tuple[str, object]]:
    for name in sorted(group.array_keys()):
        yield prefix + name, group[name]
    for name in sorted(group.group_keys()):
        if prefix or name != "images":
            yield from _arrays(group[name], f"{prefix}{name}/")


def _check_links(store: Path, root: Path, where: str) -> None:
    """Every link inside the store must resolve inside ``root``, and every file be a regular one (a FIFO would block
    zarr's open forever, a device never end): zarr opens chunk files by itself."""
    for folder, dirs, files in os.walk(store):
        for name in (*dirs, *files):
            p = Path(folder) / name
            if p.is_symlink():
                resolve_inside(p, root, where)
            if name in files and p.exists() and not stat.S_ISREG(os.stat(p).st_mode):
                raise EpisodeError(f"{where}: {p} is not a regular file (a FIFO or device in the store); replace it "
                                   "by the chunk it should be, or re-write the store")


def _check_shapes(store: Path, cams: list[tuple[str, object]], found: list[tuple[str, object]], where: str) -> None:
    """What the metadata declares, before a byte is read: a ``.zarray``/``zarr.json`` may say any shape for no disk
    (missing chunks read as the fill value), so every camera is (T, H, W, 3) uint8, every array has T steps, and the
    episode's arrays and one chunk of each fit in `memory_bound`, or the store is refused naming the array."""
    steps = int(cams[0][1].shape[0]) if len(cams[0][1].shape) else 0
    if steps == 0:
        raise EpisodeError(f"{where}: empty episode (0 frames in {store}/{cams[0][0]}); remove it or pass --skip-bad")
    need = 0
    for name, arr in [*cams, *found]:
        shape, chunks = tuple(arr.shape), tuple(getattr(arr, "chunks", ()) or ())
        if name.startswith("images/") and (arr.dtype != np.uint8 or len(shape) != 4 or shape[-1] != 3):
            raise EpisodeError(f"{where}: {store}/{name} is {arr.dtype} {shape}; images must be uint8 (T, H, W, 3) RGB")
        if not shape or shape[0] != steps:
            what = "frames" if name.startswith("images/") else "steps"
            raise EpisodeError(f"{where}: {store}/{name} declares {shape[0] if shape else 'no'} {what} but "
                               f"{store}/{cams[0][0]} has {steps} frames; every array's first dimension must equal "
                               "the frame count: re-write the store")
        need += (math.prod(shape) + math.prod(chunks)) * arr.dtype.itemsize
    bound = memory_bound()
    if need > bound:
        raise EpisodeError(f"{where}: {store} declares arrays of {need / 2**30:.1f} GiB (with a chunk of each), more "
                           f"than the {bound / 2**30:.1f} GiB an episode may take (half this machine's memory); "
                           "re-write it as smaller episodes, or pass --skip-bad")


@dataclass(frozen=True)
class ZarrReader:
    """`EpisodeReader` over ``root/<episode_id>.zarr`` groups (the layout is in this module's docstring).

    Attributes:
        root: the source folder; a store linking outside it is refused before zarr opens it.
    """

    root: Path

    def episode_ids(self) -> list[str]:
        return sorted(p.name[: -len(".zarr")] for p in Path(self.root).iterdir()
                      if p.is_dir() and p.name.endswith(".zarr"))

    def read(self, episode_id: str) -> EpisodeData:
        root = Path(self.root).resolve()
        where = f"episode {episode_id!r}"
        if not isinstance(episode_id, str) or Path(f"{episode_id}.zarr").name != f"{episode_id}.zarr":
            raise EpisodeError(f"{where}: not a store name inside {root}; pass one of episode_ids()")
        store = resolve_inside(root / f"{episode_id}.zarr", root, where)
        _check_links(store, root, where)
        try:
            g = _zarr().open_group(str(store), mode="r")
            images = g["images"] if "images" in g.group_keys() else None
            cams = sorted(images.array_keys()) if images is not None else []
            if not cams:
                raise EpisodeError(f"{where}: {store} has no images/<camera> arrays; add at least one camera")
            found = list(_arrays(g))
            for name, arr in found:  # before reading: a text array is refused without decoding it
                check_dtype(name, arr.dtype, f"{where} {store}")
            _check_shapes(store, [(f"images/{c}", images[c]) for c in cams], found, where)
            arrays = {name: np.asarray(arr[:]) for name, arr in found}
            attrs = dict(g.attrs)
        except EpisodeError:
            raise
        except Exception as e:  # a damaged store: name it instead of leaking a zarr internal
            raise EpisodeError(f"{where}: cannot read {store} ({type(e).__name__}: {e}); re-write it, "
                               "or pass --skip-bad") from e
        file = f"{where} {store} attrs"
        if "fps" not in attrs:
            raise EpisodeError(f"{file}: no fps; set group.attrs['fps'] to the frame rate")
        fps = check_fps(attrs.pop("fps"), file)
        prompt = check_text("prompt", attrs.pop("prompt", ""), file)
        split = check_text("split", attrs.pop("split", None), file, optional=True)
        structured = sorted(k for k, v in attrs.items() if isinstance(v, (list, dict)))
        if structured:
            log.info("%s: attrs %s are not JSON scalars; not kept", file, structured)
        builtin = sorted(set(attrs) & set(BUILTIN) - set(structured))  # the index has its own id, length...
        if builtin:
            log.info("%s: attrs %s name built-in episode fields; not kept", file, builtin)
            structured += builtin
        extra = check_extra({k: v for k, v in attrs.items() if k not in structured}, file)
        return EpisodeData(
            id=episode_id, cameras={c: ZarrImages(store, f"images/{c}", where) for c in cams}, arrays=arrays,
            fps=fps, prompt=prompt, split=split, files={c: f"{store}/images/{c}" for c in cams}, extra=extra,
        )
