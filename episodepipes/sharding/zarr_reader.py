"""`ZarrReader`: one zarr group per episode, ``SRC/<episode_id>.zarr``.

Layout: ``images/<camera>`` uint8 (T, H, W, 3); any other array, at any depth, is per-step
(T, ...) and keeps its path as its name (``obs/state``); attrs ``fps``, ``prompt``, ``split``.
Each array is read with one ``[:]`` (one pass over its chunks), never frame by frame, which
on chunked, compressed stores is the difference between reading a chunk once and T times.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from episodepipes.sharding.episode import EpisodeData, EpisodeError


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


@dataclass(frozen=True)
class ZarrReader:
    """`EpisodeReader` over ``root/<episode_id>.zarr`` groups."""

    root: Path

    def episode_ids(self) -> list[str]:
        return sorted(p.name[: -len(".zarr")] for p in Path(self.root).iterdir()
                      if p.is_dir() and p.name.endswith(".zarr"))

    def read(self, episode_id: str) -> EpisodeData:
        store = Path(self.root) / f"{episode_id}.zarr"
        where = f"episode {episode_id!r}"
        try:
            g = _zarr().open_group(str(store), mode="r")
            images = g["images"] if "images" in g.group_keys() else None
            cams = sorted(images.array_keys()) if images is not None else []
            if not cams:
                raise EpisodeError(f"{where}: {store} has no images/<camera> arrays; add at least one camera")
            arrays = {name: np.asarray(arr[:]) for name, arr in _arrays(g)}
            attrs = dict(g.attrs)
        except EpisodeError:
            raise
        except Exception as e:  # a damaged store: name it instead of leaking a zarr internal
            raise EpisodeError(f"{where}: cannot read {store} ({e}); re-write it, or pass --skip-bad") from e
        fps = attrs.get("fps")
        if not isinstance(fps, (int, float)) or not fps > 0:
            raise EpisodeError(f"{where}: {store} attrs have fps={fps!r}; set group.attrs['fps'] to the frame rate")
        return EpisodeData(
            id=episode_id, cameras={c: ZarrImages(store, f"images/{c}", where) for c in cams}, arrays=arrays,
            fps=float(fps), prompt=str(attrs.get("prompt", "")), split=attrs.get("split"),
            files={c: f"{store}/images/{c}" for c in cams},
        )
