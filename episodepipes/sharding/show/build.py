"""`show`: write one self-contained HTML page of a dataset (local or remote), reading only the episodes it shows."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from episodepipes import safefile
from episodepipes.index import EpisodeIndex, IndexFormatError
from episodepipes.sharding import inspect
from episodepipes.sharding.show import figures, page, summary
from episodepipes.sharding.show.read import Counts, read_episode
from episodepipes.sharding.show.select import chosen

log = logging.getLogger(__name__)

MAX_EPISODES = 4  # default: episodes a page shows when none are named
MAX_FRAMES = 3000  # default: frames shown per episode (5 minutes at 10 fps, 100 s at 30)


@dataclass(frozen=True)
class ShowResult:
    """What `show` wrote and read.

    Attributes:
        page: the HTML file written.
        episodes: the ids of the episodes shown, in page order.
        frames: frames shown per episode, in the same order.
        counts: what was read from the shards (bytes, reads, shard names): the shown episodes' frames only.
    """

    page: Path
    episodes: list[str]
    frames: list[int]
    counts: Counts


def _require() -> None:
    """The ``show`` extra's packages, or an ImportError naming its pip install."""
    try:
        import av  # noqa: F401
        import plotly  # noqa: F401
    except ImportError as e:
        raise ImportError(f"episodepipes-shard show needs {e.name}: pip install 'episodepipes[show]'") from None


def default_page(out: str | os.PathLike) -> Path:
    """``<name of OUT>.html`` in the current folder (never inside the dataset: it may be read-only or remote)."""
    name = str(out).rstrip("/").rsplit("/", 1)[-1] or "dataset"
    return Path(f"{name}.html")


def show(out: str | os.PathLike, episodes: Sequence[str] = (), *, page_path: str | os.PathLike | None = None,
         max_episodes: int = MAX_EPISODES, max_frames: int = MAX_FRAMES,
         index: EpisodeIndex | None = None) -> ShowResult:
    """Write one HTML page of the dataset at ``out``: the episodes' videos in sync with plots of their arrays, their
    attributes, and a view of the whole dataset from its index and statistics. Reads the index, its statistics and
    the shown episodes' frames (the first ``max_frames`` of each), nothing else; the page needs no network.

    Args:
        out: a shard folder, or a remote root (``s3://bucket/prefix``, ``gs://...``, ``https://...``).
        episodes: ids to show, in this order; none: the first ``max_episodes`` in index order.
        page_path: the HTML file to write (default `default_page`); written atomically, never through a link.
        max_episodes: the most episodes a page shows (more ids is a ValueError naming the option).
        max_frames: frames shown per episode, from its first; the page says where an episode is cut.
        index: the dataset's index, when the caller opened it already.
    """
    _require()
    if max_frames < 1:
        raise ValueError(f"--max-frames {max_frames} must be >= 1")
    index = index if index is not None else EpisodeIndex.open(out)
    eps = chosen(index, episodes, max_episodes=max_episodes)
    target = Path(page_path) if page_path is not None else default_page(out)
    counts, shown, figs = Counts(), [], []
    for ep in eps:
        s = read_episode(index, ep, max_frames=max_frames, counts=counts)
        shown.append(s)
        figs.append({k: figures.array_figure(k, v, ep.fps) for k, v in s.arrays.items()})
    try:
        table, unreadable = summary.stats(index), ""
    except IndexFormatError as e:  # the page is where a damaged dataset gets looked at: say so there, go on
        table, unreadable = None, str(e)
        log.warning("%s", e)
    views = {"splits": summary.split_figure(index), "lengths": summary.length_figure(index)}
    for k, (_, fig) in enumerate(summary.distribution_figures(index, table or []).items()):
        views[f"dist-{k}"] = fig
    total = len(index.episodes)
    notes = []
    if len(eps) < total:
        notes.append(f"{len(eps)} of {total} episodes shown" + ("" if episodes else
                     f" (the first {len(eps)} in index order; name episodes as EPISODE arguments, or raise "
                     "--max-episodes)"))
    cut = [s.episode.id for s in shown if s.frames < s.episode.length]
    if cut:
        notes.append(f"{len(cut)} episodes shown up to frame {max_frames} (--max-frames {max_frames}; raise it to "
                     "see more)")
    data = page.render(page.Page(title=str(out), facts=inspect.summarize(index), note="; ".join(notes),
                                 summary=views, stats=table, stats_error=unreadable, episodes=shown, figures=figs))
    safefile.write_file(target, data)
    for n in notes:
        log.warning("%s", n)
    return ShowResult(target, [s.episode.id for s in shown], [s.frames for s in shown], counts)
