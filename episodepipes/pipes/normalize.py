"""`Normalize`: per-key affine scaling from dataset statistics, run in the decode workers, and its inverse.

Every mode is ``y = (x - center) / scale`` per element of a key's step shape, broadcast over any
leading axes (a history/horizon window, a batch):

- ``"mean_std"``: ``center = mean``, ``scale = std`` (LeRobot's MEAN_STD);
- ``"quantile"``: ``q01 -> -1`` and ``q99 -> 1`` (openpi's quantile normalization);
- ``"min_max"``: ``min -> -1`` and ``max -> 1`` (LeRobot's MIN_MAX).

A dimension whose scale is at most ``eps`` (a constant joint, a gripper that never moved: zero std, or
``q01 == q99``) gets ``scale = 1`` instead: it maps to ``x - center`` (zero on the data it came from)
rather than dividing noise by a tiny number, and the inverse stays exact. Values are not clipped.

Floating inputs keep their dtype (float32 stays float32); integer inputs become float32. The call
takes a sample dict of numpy arrays (as the decode workers produce) and `Normalize.inverse` takes numpy
arrays or torch tensors (predictions, batched or not), on any device.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from episodepipes.normstats import ArrayStats

__all__ = ["Normalize", "PerSource"]  # documented in docs/API.md under this module, the path users import from

MODES = {"mean_std": ("mean", "std"), "quantile": ("q01", "q99"), "min_max": ("min", "max")}
EPS = 1e-8


def _summary(key: str, s: Any) -> Mapping[str, Any]:
    if isinstance(s, ArrayStats):
        return s.summary()
    if isinstance(s, Mapping):
        return s
    raise TypeError(f"stats[{key!r}] should be an ArrayStats or its summary() dict, got {type(s).__name__}")


@dataclass(frozen=True)
class Normalize:
    """Scale the arrays of a sample, key by key; picklable, so it runs in process workers too.

    Attributes:
        center: key -> float64 array of the step shape.
        scale: key -> float64 array of the step shape (positive).
        mode: the mode it was built with.
    """

    center: Mapping[str, np.ndarray]
    scale: Mapping[str, np.ndarray]
    mode: str

    @classmethod
    def from_stats(cls, stats: Mapping[str, Any], *, mode: str = "mean_std", keys: Sequence[str] | None = None,
                   eps: float = EPS) -> Normalize:
        """Build from statistics, e.g. ``{"action": index.stats("action", split="train")}``.

        Args:
            stats: key -> `ArrayStats` or its ``summary()`` dict.
            mode: ``"mean_std"``, ``"quantile"`` or ``"min_max"`` (see the module docstring).
            keys: the keys to normalize (default: every key of ``stats``).
            eps: a scale at most this is replaced by 1.
        """
        if mode not in MODES:
            raise ValueError(f"{mode=} should be one of {sorted(MODES)}")
        if not eps >= 0:
            raise ValueError(f"{eps=} should be >= 0")
        keys = list(stats) if keys is None else list(keys)
        if not keys:
            raise ValueError("no keys to normalize; pass stats for at least one array key")
        center, scale = {}, {}
        for k in keys:
            if k not in stats:
                raise KeyError(f"keys names {k!r}, but stats has only {sorted(stats)}")
            s = _summary(k, stats[k])
            a, b = (np.asarray(s[f], np.float64) for f in MODES[mode])
            if a.shape != b.shape or not (np.isfinite(a).all() and np.isfinite(b).all()):
                raise ValueError(f"stats[{k!r}] has {MODES[mode]} of shapes {a.shape}, {b.shape} or non-finite "
                                 "values; recompute the statistics")
            c, half = (a, b) if mode == "mean_std" else ((a + b) / 2, (b - a) / 2)
            center[k], scale[k] = c, np.where(half > eps, half, 1.0)
        return cls(center, scale, mode)

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        """A copy of ``sample`` with every normalized key scaled (each must be present)."""
        out = dict(sample)
        for k in self.center:
            if k not in sample:
                raise KeyError(f"Normalize has statistics for {k!r} but the sample has keys {sorted(sample)}; "
                               "pass keys= to normalize fewer")
            x = np.asarray(sample[k])
            c, s = self._params(k, x.shape, x.dtype)
            out[k] = ((x - c) / s).astype(c.dtype, copy=False)
        return out

    def inverse(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        """A copy of ``batch`` with each normalized key it holds mapped back (numpy arrays or torch tensors).

        Args:
            batch: key -> values (a prediction or a batch, any leading axes); keys not normalized pass through.
        """
        known = [k for k in self.center if k in batch]
        if not known:
            raise KeyError(f"the batch has none of the normalized keys {sorted(self.center)}; it has {sorted(batch)}")
        out = dict(batch)
        for k in known:
            x = batch[k]
            if isinstance(x, torch.Tensor):
                dt = x.dtype if x.is_floating_point() else torch.float32
                c, s = (torch.as_tensor(v, dtype=dt, device=x.device) for v in self._params(k, x.shape, np.float64))
                out[k] = x.to(dt) * s + c
            else:
                x = np.asarray(x)
                c, s = self._params(k, x.shape, x.dtype)
                out[k] = (x * s + c).astype(c.dtype, copy=False)
        return out

    def _params(self, key: str, shape: tuple[int, ...], dtype: Any) -> tuple[np.ndarray, np.ndarray]:
        """Center and scale of ``key`` in ``dtype`` (float32 for a non-float dtype), after a shape check."""
        c = self.center[key]
        if len(shape) < c.ndim or tuple(shape[len(shape) - c.ndim:]) != c.shape:
            raise ValueError(f"{key!r} has shape {tuple(shape)}; its statistics are for steps of shape {c.shape} "
                             "(with any leading axes)")
        dt = np.dtype(dtype) if np.dtype(dtype).kind == "f" else np.dtype(np.float32)
        return c.astype(dt), self.scale[key].astype(dt)


@dataclass(frozen=True)
class PerSource:
    """For a mixture: one `Normalize` per source, picked by the sample's ``source`` field.

    Attributes:
        by_source: source name -> its `Normalize`.
        field: the sample (and batch) key naming the source.
    """

    by_source: Mapping[str, Normalize]
    field: str = "source"

    @classmethod
    def from_stats(cls, stats: Mapping[str, Mapping[str, Any]], *, mode: str = "mean_std",
                   keys: Sequence[str] | None = None, eps: float = EPS) -> PerSource:
        """``stats``: source -> key -> statistics; the other arguments as in `Normalize.from_stats`.

        Args:
            stats: source name -> (key -> `ArrayStats` or summary dict).
            mode, keys, eps: as for `Normalize.from_stats`, the same for every source.
        """
        return cls({src: Normalize.from_stats(s, mode=mode, keys=keys, eps=eps) for src, s in stats.items()})

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        """``by_source[sample[field]](sample)``."""
        if self.field not in sample:
            raise KeyError(f"the sample has no {self.field!r} field naming its source; it has {sorted(sample)}")
        return self._of(sample[self.field])(sample)

    def inverse(self, batch: Mapping[str, Any], *, source: str | Sequence[str] | None = None) -> dict[str, Any]:
        """Map a batch back with each row's own source (``source``, default ``batch[field]``, one per row).

        Args:
            batch: key -> values with a leading batch axis, as `Normalize.inverse` takes them.
            source: one source name for every row, or one per row; None: ``batch[field]``.
        """
        source = batch.get(self.field) if source is None else source
        if isinstance(source, str):
            return self._of(source).inverse(batch)
        if source is None:
            raise KeyError(f"the batch has no {self.field!r} field; pass source= (a name, or one per row)")
        rows = list(source)
        out = dict(batch)
        for name in sorted(set(rows)):
            idx = [i for i, s in enumerate(rows) if s == name]
            norm = self._of(name)
            for k, v in norm.inverse({k: v[idx] for k, v in batch.items() if k in norm.center}).items():
                if out[k] is batch[k]:  # first group: a float copy, so rows of sources without k stay as given
                    x = batch[k]
                    if len(x) != len(rows):
                        raise ValueError(f"batch[{k!r}] has {len(x)} rows but source names {len(rows)}")
                    out[k] = (x.to(v.dtype).clone() if isinstance(x, torch.Tensor)
                              else np.array(x, dtype=v.dtype))
                out[k][idx] = v
        return out

    def _of(self, name: Any) -> Normalize:
        if name not in self.by_source:
            raise KeyError(f"source {name!r} has no statistics; sources with statistics: {sorted(self.by_source)}")
        return self.by_source[name]
