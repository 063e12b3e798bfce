"""The whole dataset at a glance, from the index alone (no shard is read): episodes and frames per split, a
histogram of episode lengths, each array's distribution per split from the stored statistics, and those statistics
as a table's rows."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from episodepipes.index import EpisodeIndex
from episodepipes.index.v2 import SPLIT
from episodepipes.sharding.show.figures import element_names, label

MAX_ELEMENTS = 32  # elements of one array whose distribution is drawn
BINS = 40  # the length histogram's most bins


@dataclass(frozen=True)
class Stat:
    """One array's statistics over one split (``values``: name -> per-element list), or why there are none."""

    split: str
    key: str
    count: int
    values: dict[str, list[float]]
    missing: str = ""


def stats(index: EpisodeIndex) -> list[Stat] | None:
    """Every (split, array) the index has statistics or a reason for, sorted; None when it has none at all."""
    keys = index.stats_keys()
    if keys is None:
        return None
    out = []
    for split, key in keys:
        try:
            s = index.stats(key, split)
        except KeyError as e:
            out.append(Stat(split, key, 0, {}, missing=str(e.args[0])))
            continue
        out.append(Stat(split, key, int(s["count"]),
                        {k: np.asarray(v, np.float64).reshape(-1).tolist() for k, v in s.items() if k != "count"}))
    return out


def split_figure(index: EpisodeIndex) -> dict:
    """Episodes per split, as bars (the hover gives the frames too)."""
    import plotly.graph_objects as go

    t = index.tables
    codes = t.episodes[:, SPLIT].astype(np.int64)
    eps = np.bincount(codes, minlength=len(t.splits))
    frames = np.bincount(codes, weights=index.lengths.astype(np.float64), minlength=len(t.splits))
    names = [label(s) for s in t.splits]
    if len(set(names)) < len(names):  # two names alike up to the cut would share one bar
        names = [f"{k}: {n}" for k, n in enumerate(names)]
    fig = go.Figure(go.Bar(x=names, y=eps.tolist(), customdata=frames.astype(np.int64).tolist(),
                           hovertemplate="%{x}: %{y} episodes, %{customdata} frames<extra></extra>"))
    fig.update_layout(title={"text": "episodes per split", "x": 0.01}, height=240,
                      xaxis={"type": "category"}, margin={"l": 50, "r": 10, "t": 30, "b": 40})
    return fig.to_plotly_json()


def length_figure(index: EpisodeIndex) -> dict:
    """A histogram of episode lengths (frames), stacked by split; binned here, so its size does not grow with
    the episodes."""
    import plotly.graph_objects as go

    t, lengths = index.tables, index.lengths.astype(np.int64)
    codes = t.episodes[:, SPLIT].astype(np.int64)
    lo, hi = (int(lengths.min()), int(lengths.max())) if len(lengths) else (0, 1)
    width = max(1, -(-(hi - lo + 1) // BINS))
    edges = np.arange(lo, hi + width + 1, width)
    fig = go.Figure()
    for k, name in enumerate(t.splits):
        counts, _ = np.histogram(lengths[codes == k], bins=edges)
        fig.add_trace(go.Bar(x=edges[:-1].tolist(), y=counts.tolist(), name=label(name), width=width,
                             offset=0, hovertemplate="%{x} frames and up: %{y} episodes"))
    fig.update_layout(title={"text": "episode lengths (frames)", "x": 0.01}, barmode="stack", height=240,
                      margin={"l": 50, "r": 10, "t": 30, "b": 40})
    return fig.to_plotly_json()


def distribution_figures(index: EpisodeIndex, table: list[Stat]) -> dict[str, dict]:
    """array -> a box per split and element from the stored statistics: the box spans q10..q90 around the median
    (q50), the whiskers q01..q99, with the mean and standard deviation marked."""
    import plotly.graph_objects as go

    shapes = {name: spec.shape for _, arrays in index.tables.schemas for name, spec in arrays.items()}
    figs: dict[str, go.Figure] = {}
    for s in table:
        if s.missing or not s.values:
            continue
        names = element_names(s.key, tuple(shapes.get(s.key, ())))
        if len(names) != len(s.values["mean"]):
            names = [f"{s.key}[{k}]" for k in range(len(s.values["mean"]))]
        m = min(len(names), MAX_ELEMENTS)
        v = {k: x[:m] for k, x in s.values.items()}
        fig = figs.setdefault(s.key, go.Figure())
        fig.add_trace(go.Box(x=[label(n) for n in names[:m]], name=label(s.split), lowerfence=v["q01"], q1=v["q10"],
                             median=v["q50"], q3=v["q90"], upperfence=v["q99"], mean=v["mean"], sd=v["std"]))
    out = {}
    for key, fig in sorted(figs.items()):
        title = label(f"{key}: q10-q90 box, q01-q99 whiskers, mean and std dashed", limit=120)
        fig.update_layout(title={"text": title, "x": 0.01}, boxmode="group", height=280,
                          margin={"l": 50, "r": 10, "t": 30, "b": 40})
        out[key] = fig.to_plotly_json()
    return out
