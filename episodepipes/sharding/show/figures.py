"""The plotly figures of one episode: each array over time, every element a line (at most `MAX_LINES`), with a
vertical cursor line (the layout's first shape) that the page's script moves to the video's time.

Figures are plain plotly dicts (``fig.to_plotly_json()``); their text (names, titles, hovers) goes through `label`,
since plotly.js renders a small set of HTML tags and entities inside labels.
"""

from __future__ import annotations

import html
import itertools

import numpy as np

MAX_LINES = 16  # elements of one array drawn as lines; a (64, 64) array is not 4096 lines
CURSOR = {"type": "line", "xref": "x", "yref": "paper", "x0": 0, "x1": 0, "y0": 0, "y1": 1,
          "line": {"color": "#d62728", "width": 2}}


def label(text: str, limit: int = 40) -> str:
    """Text from the dataset as plotly shows it: cut to ``limit`` characters (a long split name would squeeze the
    plot; the page's tables give it whole), its markup escaped (plotly.js draws ``<b>`` and links in labels and
    turns ``&lt;``, ``&gt;`` and ``&amp;`` back into characters; quotes need no escape outside a tag)."""
    text = str(text)
    return html.escape(text if len(text) <= limit else text[:limit - 1] + "\u2026", quote=False)


def element_names(name: str, shape: tuple[int, ...]) -> list[str]:
    """``state[0]``, ``state[1]``, ... (``kp[0,1]`` for more dimensions; ``name`` alone for a scalar)."""
    if not shape:
        return [name]
    return [f"{name}[{','.join(map(str, ix))}]" for ix in itertools.product(*(range(s) for s in shape))]


def array_figure(name: str, values: np.ndarray, fps: float) -> dict:
    """``values`` (``(frames, *shape)``) of array ``name`` against time in seconds, a line per element (the
    first `MAX_LINES`); NaN (a damaged frame) is a gap in the line."""
    import plotly.graph_objects as go

    n = len(values)
    flat = values.reshape(n, -1)
    names = element_names(name, values.shape[1:])
    t = np.arange(n) / fps
    fig = go.Figure()
    for k in range(min(flat.shape[1], MAX_LINES)):
        fig.add_trace(go.Scatter(x=t, y=flat[:, k], mode="lines", name=label(names[k]),
                                 hovertemplate="%{x:.3f} s: %{y:.4g}"))
    title = label(name) if flat.shape[1] <= MAX_LINES else \
        label(f"{name} (first {MAX_LINES} of {flat.shape[1]} elements)", limit=80)
    fig.update_layout(title={"text": title, "x": 0.01}, height=220, margin={"l": 50, "r": 10, "t": 30, "b": 30},
                      xaxis={"title": {"text": "seconds"}, "range": [0, n / fps]},
                      shapes=[CURSOR], showlegend=flat.shape[1] > 1, legend={"font": {"size": 10}})
    return fig.to_plotly_json()
