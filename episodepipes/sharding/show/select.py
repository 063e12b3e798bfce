"""Which episodes a page shows: the ids asked for, or the first ``max_episodes`` in index order; never more than
``max_episodes`` (a cap the user raises by name, so a large dataset does not turn into a page of gigabytes)."""

from __future__ import annotations

from collections.abc import Sequence

from episodepipes.index import Episode, EpisodeIndex


def chosen(index: EpisodeIndex, ids: Sequence[str], *, max_episodes: int) -> list[Episode]:
    """The episodes to show, in the order asked (repeats dropped), or the first ``max_episodes`` of the index.

    Args:
        index: the dataset.
        ids: episode ids from the command line (any text: they are checked against the index, never trusted).
        max_episodes: the most a page shows; more ids than that is a ValueError naming ``--max-episodes``.
    """
    if max_episodes < 1:
        raise ValueError(f"--max-episodes {max_episodes} must be >= 1")
    if not ids:
        return [index.episodes[n] for n in range(min(max_episodes, len(index.episodes)))]
    wanted = list(dict.fromkeys(ids))
    if len(wanted) > max_episodes:
        raise ValueError(f"{len(wanted)} episodes asked for, more than --max-episodes {max_episodes} (each one's "
                         f"videos go into the page); pass --max-episodes {len(wanted)} to show them all")
    out = []
    for eid in wanted:
        try:
            out.append(index.episode(eid))
        except KeyError as e:  # its message names the index and close matches; a KeyError would quote it again
            raise ValueError(e.args[0]) from None
    return out
