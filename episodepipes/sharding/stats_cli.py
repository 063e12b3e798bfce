"""The ``stats`` command: print an output's normalization statistics, computing them first with ``--recompute``."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from episodepipes.format import INDEX_NAME
from episodepipes.index import EpisodeIndex
from episodepipes.remote.retry import printable
from episodepipes.sharding.recompute import add_stats

FIELDS = ("mean", "std", "min", "max", "q01", "q10", "q50", "q90", "q99")
MAX_SHOWN = 8  # elements per row; wider keys end with "..."


def _row(values: np.ndarray) -> str:
    flat = values.reshape(-1)
    text = " ".join(f"{v:>10.4g}" for v in flat[:MAX_SHOWN].tolist())
    return text + (f" ... ({len(flat)} elements)" if len(flat) > MAX_SHOWN else "")


def table(index: EpisodeIndex) -> list[str]:
    """A compact table per split and key: the count and shape, then one row per statistic (split and key names,
    the dataset's text, with control characters escaped)."""
    lines = []
    for split, key in index.stats_keys() or ():
        where = f"{printable(split)}/{printable(key)}"
        try:
            s = index.stats(key, split=split)
        except KeyError as e:
            lines.append(f"{where}: no statistics: {printable(str(e.args[0]).split(': ', 1)[-1])}")
            continue
        lines.append(f"{where}  count={s['count']}  shape={tuple(s['mean'].shape)}")
        lines += [f"  {name:<4} {_row(s[name])}" for name in FIELDS]
    return lines or ["no arrays: nothing to normalize"]


def _values(a: np.ndarray) -> object:
    """An array as nested lists, a non-finite value as None (JSON has no NaN or Infinity)."""
    a = np.asarray(a, dtype=np.float64)
    out = a.astype(object)
    out[~np.isfinite(a)] = None
    return out.tolist()


def data(index: EpisodeIndex) -> dict:
    """``{split: {key: {"count", "shape", "mean", ...}}}`` with every element (``stats --json``); a key without
    statistics has ``{"error": why}`` instead. Split and key names are the dataset's text, as it is."""
    out: dict = {}
    for split, key in index.stats_keys() or ():
        try:
            s = index.stats(key, split=split)
        except KeyError as e:
            out.setdefault(split, {})[key] = {"error": str(e.args[0]).split(": ", 1)[-1]}
            continue
        out.setdefault(split, {})[key] = {"count": int(s["count"]), "shape": list(s["mean"].shape),
                                          **{name: _values(s[name]) for name in FIELDS}}
    return out


def run(out: Path, *, recompute: bool, as_json: bool = False) -> list[str] | dict:
    """The lines to print for ``stats OUT [--recompute]`` (with ``as_json``, `data`'s dict); an index without
    statistics is refused by name."""
    if recompute:
        add_stats(out)
    index = EpisodeIndex.open(out)
    if index.stats_keys() is None:
        raise ValueError(f"{Path(out) / INDEX_NAME} has no statistics (written by an older episodepipes); "
                         f"compute them with: episodepipes-shard stats {out} --recompute")
    return data(index) if as_json else table(index)
