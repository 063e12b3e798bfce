"""The page: one HTML file that needs nothing else (plotly.js, the data and the videos are inside it).

Every text that comes from the dataset (root, ids, splits, prompts, attributes, camera and array names, errors) is
HTML-escaped where it is written into the page (`esc`); the figures travel as JSON inside a ``<script
type="application/json">`` with ``<``, ``>`` and ``&`` escaped, so no string in them can end the element. The
Content-Security-Policy allows only the page's own two scripts (by their sha256) and ``data:`` videos: a script a
dataset managed to smuggle in would still not run, and the page loads nothing from the network.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources

from episodepipes.sharding.show.read import Shown
from episodepipes.sharding.show.summary import Stat

MAX_STAT_ELEMENTS = 16  # elements of one array in the statistics table
MAX_DAMAGED = 20  # damaged frames listed by name per episode


def esc(text: object) -> str:
    """``text`` as HTML text or attribute value: ``& < > " '`` escaped."""
    return html.escape(str(text), quote=True)


def script_json(data: object) -> str:
    """``data`` as JSON to put inside a ``<script>`` element: nothing in it can close the element or open a
    comment (plotly's encoder also turns numpy arrays into lists and NaN into null)."""
    from plotly.io.json import to_json_plotly

    text = to_json_plotly(data)
    for ch, code in (("&", "\\u0026"), ("<", "\\u003c"), (">", "\\u003e"), ("\u2028", "\\u2028"),
                     ("\u2029", "\\u2029")):
        text = text.replace(ch, code)
    return text


@dataclass(frozen=True)
class Page:
    """What the page shows.

    Attributes:
        title: the dataset's root, as given.
        facts: (field, value) rows of the dataset (``info``'s table).
        note: what the page leaves out and the option that shows it ("" when nothing).
        summary: element id -> figure of the dataset's view.
        stats: the stored statistics (None: the index has none, or they are unreadable).
        stats_error: why the statistics are unreadable ("" when they are not).
        episodes: the episodes shown.
        figures: per shown episode, array name -> figure.
    """

    title: str
    facts: list[tuple[str, str]]
    note: str
    summary: dict[str, dict]
    stats: list[Stat] | None
    stats_error: str
    episodes: Sequence[Shown]
    figures: Sequence[dict[str, dict]]


def _table(rows: Sequence[tuple[str, str]]) -> str:
    return "<table class=\"facts\">" + "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in rows) + \
        "</table>"


def _stats_html(stats: list[Stat] | None, error: str) -> str:
    if error:
        return f"<p class=\"note\">The statistics are unreadable: {esc(error)}</p>"
    if stats is None:
        return ("<p>The index has no statistics (written before episodepipes computed them): "
                "<code>episodepipes-shard stats OUT --recompute</code> adds them.</p>")
    parts = []
    for key in sorted({s.key for s in stats}):
        rows = []
        for s in (s for s in stats if s.key == key):
            if s.missing:
                rows.append(f"<tr><th>{esc(s.split)}</th><td colspan=\"3\">{esc(s.missing)}</td></tr>")
                continue
            for name in ("mean", "std", "min", "max", "q01", "q50", "q99"):
                v = s.values[name]
                cells = " ".join(f"{x:.4g}" for x in v[:MAX_STAT_ELEMENTS]) + (" ..." if len(v) > MAX_STAT_ELEMENTS
                                                                                else "")
                rows.append(f"<tr><th>{esc(s.split)}</th><td>{s.count}</td><td>{name}</td><td>{esc(cells)}</td></tr>")
        parts.append(f"<h3>{esc(key)}</h3><table class=\"stats\"><tr><th>split</th><th>steps</th><th>statistic</th>"
                     f"<th>per element</th></tr>{''.join(rows)}</table>")
    return "".join(parts)


def _episode_html(i: int, shown: Shown, figures: dict[str, dict]) -> str:
    ep = shown.episode
    cams = [f"{c} {cam.height}x{cam.width} {cam.codec}" + (f" gop {cam.gop}" if cam.codec != "jpeg" else "") +
            (f" (source: {cam.source})" if cam.source != c else "") for c, cam in sorted(ep.cameras.items())]
    arrays = [f"{k} {a.dtype}{tuple(a.shape)}" + (f" (source: {a.source})" if a.source != k else "")
              for k, a in sorted(ep.arrays.items())]
    shown_frames = f"{shown.frames} of {ep.length}" + ("" if shown.frames == ep.length else
                                                       " (the first ones; --max-frames shows more)")
    rows = [("split", ep.split), ("frames", shown_frames), ("fps", f"{ep.fps:g}"), ("prompt", ep.prompt or "-"),
            ("cameras", ", ".join(cams) or "-"), ("arrays", ", ".join(arrays) or "-")]
    rows += [(f"attribute {k}", json.dumps(v, ensure_ascii=False)) for k, v in sorted(ep.meta.items())]
    if shown.damaged:
        rows.append(("damaged frames", f"{len(shown.damaged)}: " + "; ".join(
            f"frame {t}: {why}" for t, why in shown.damaged[:MAX_DAMAGED]) +
            (" ..." if len(shown.damaged) > MAX_DAMAGED else "")))
    videos = "".join(
        f"<figure><video muted playsinline preload=\"auto\" data-camera=\"{esc(c)}\" "
        f"src=\"data:video/mp4;base64,{base64.b64encode(shown.videos[c]).decode('ascii')}\"></video>"
        f"<figcaption>{esc(c)}</figcaption></figure>" for c in sorted(shown.videos))
    plots = "".join(f"<div class=\"plot\" id=\"plot-{i}-{k}\"></div>" for k in range(len(figures)))
    return (f"<section class=\"episode\" id=\"episode-{i}\"><h2>episode {esc(ep.id)}</h2>{_table(rows)}"
            f"<div class=\"videos\">{videos}</div><div class=\"controls\"><button class=\"play\" type=\"button\">"
            "play</button><input class=\"scrub\" type=\"range\" min=\"0\" value=\"0\"><span class=\"time\">"
            f"</span></div>{plots}</section>")


STYLE = """body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}table{border-collapse:collapse;margin:.5em 0}
th,td{border:1px solid #ddd;padding:2px 8px;text-align:left;vertical-align:top;font-size:13px}
td{white-space:pre-wrap;word-break:break-word}.videos{display:flex;flex-wrap:wrap;gap:12px}
figure{margin:0}video{height:240px;max-width:480px;background:#000}figcaption{font-size:13px}
.controls{display:flex;gap:8px;align-items:center;margin:6px 0}.scrub{width:420px}.plot{width:100%}
section.episode{border-top:2px solid #888;margin-top:2em}.note{background:#fff6d5;padding:6px}
.pair{display:flex;gap:12px}.pair>.plot{width:50%}"""


def render(page: Page) -> bytes:
    """The page's bytes (UTF-8)."""
    from plotly.offline import get_plotlyjs

    plotly_js = get_plotlyjs()
    player_js = resources.files(__package__).joinpath("player.js").read_text("utf-8")
    for name, js in (("plotly.js", plotly_js), ("player.js", player_js)):
        if "</script" in js.lower():  # it would end its element early; plotly's own pages inline it as this does
            raise RuntimeError(f"{name} holds '</script' and cannot be inlined; report this episodepipes bug")
    data = {"summary": page.summary,
            "episodes": [{"fps": s.episode.fps, "frames": s.frames,
                          "plots": [{"id": f"plot-{i}-{k}", "figure": f} for k, f in enumerate(figs.values())]}
                         for i, (s, figs) in enumerate(zip(page.episodes, page.figures))]}
    hashes = " ".join(f"'sha256-{base64.b64encode(hashlib.sha256(js.encode()).digest()).decode()}'"
                      for js in (plotly_js, player_js))
    csp = (f"default-src 'none'; script-src {hashes}; style-src 'unsafe-inline'; media-src data:; "
           "img-src data:; font-src data:")
    dist = "".join(f"<div class=\"plot\" id=\"{k}\"></div>" for k in page.summary if k.startswith("dist-"))
    note = f"<p class=\"note\">{esc(page.note)}</p>" if page.note else ""
    episodes = "".join(_episode_html(i, s, f) for i, (s, f) in enumerate(zip(page.episodes, page.figures)))
    body = (f"<h1>{esc(page.title)}</h1>{_table(page.facts)}{note}<h2>The dataset</h2><div class=\"pair\">"
            "<div class=\"plot\" id=\"splits\"></div><div class=\"plot\" id=\"lengths\"></div></div>"
            f"<h2>Episodes</h2>{episodes}<h2>Statistics</h2>{dist}{_stats_html(page.stats, page.stats_error)}")
    text = (f"<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta http-equiv=\"Content-Security-Policy\" content=\"{csp}\">"
            f"<title>{esc(page.title)}</title><style>{STYLE}</style><script>{plotly_js}</script></head><body>{body}"
            f"<script type=\"application/json\" id=\"episodepipes-data\">{script_json(data)}</script>"
            f"<script>{player_js}</script></body></html>")
    return text.encode("utf-8", "replace")  # a lone surrogate (JSON allows "\\ud800") becomes "?"
