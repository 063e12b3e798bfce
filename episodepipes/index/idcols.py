"""Episode ids and attributes as mapped columns: looked up by id without a Python object per episode.

An index of 10**6 episodes that lists its ids in ``index.json`` parses a million strings (and a dict to find them)
in every rank and worker at open: seconds and hundreds of MB per process. The writer keeps them in columns instead
(`episodepipes.format.EPISODE_COLUMNS`), mapped and shared through the page cache like the others:

- ``ids``: every episode's id as ASCII, NUL-padded to the longest (numpy ``|S<width>``), in index order;
- ``id_order``: the episode numbers in the order that sorts the ids, so an id is found by ``np.searchsorted`` over
  ``ids`` with it as ``sorter`` (log2 episodes comparisons, nothing copied);
- ``attr``: each episode's code into the JSON's ``attrs``, the distinct attribute dicts (``{}`` for none): an
  attribute set shared by many episodes (LeRobot's ``robot_type``) is stored, checked and parsed once.

All three are checked at open, vectorised a block of episodes at a time so the temporaries stay small: every id is
tar-safe (`episodepipes.index.check.check_id`'s rule), ``id_order`` is a permutation under which the ids strictly
increase (so no id appears twice), and every code is below the number of ``attrs``. An index written before these
columns (``"ids"`` and ``"episode_meta"`` in its JSON) still opens: `from_json` builds the same arrays from its
lists, at the per-episode cost such an index always had.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from episodepipes.index.check import Where
from episodepipes.index.columns import release

MAX_ID_BYTES = 4096  # a width no real id reaches; a crafted one is refused before the column is mapped
BLOCK = 1 << 16  # episodes checked at a time (temporaries of a few MB at the widest ids)
ID_DTYPE = re.compile(r"\|S([1-9][0-9]{0,3})")
_ALLOWED = np.zeros(256, bool)  # the bytes of a tar-safe id (`check._ID`), and NUL, the padding
for _c in b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-.":
    _ALLOWED[_c] = True
_ALLOWED[0] = True


def id_width(dtype: Any) -> int | None:
    """The width of an ``ids`` column's declared dtype (``"|S12"`` -> 12), or None when it is not one."""
    m = ID_DTYPE.fullmatch(dtype) if isinstance(dtype, str) else None
    return int(m.group(1)) if m and int(m.group(1)) <= MAX_ID_BYTES else None


def build(ids: Sequence[str], episode_meta: Sequence[Sequence]) -> tuple[list[dict], dict[str, np.ndarray]]:
    """(the ``attrs`` list, the ``ids``/``id_order``/``attr`` columns) of an index's id list and its v2 JSON
    ``episode_meta`` ([episode number, attributes] of the episodes that have some). The ids are tar-safe ASCII
    (`episodepipes.format.safe_episode_id`); ``attrs`` starts with ``{}`` and holds each distinct dict once."""
    width = max((len(i) for i in ids), default=1)
    col = np.array(ids, dtype=f"S{max(width, 1)}") if len(ids) else np.zeros(0, "S1")
    order = np.argsort(col, kind="stable").astype("<i8")
    attrs: list[dict] = [{}]
    codes: dict[str, int] = {"{}": 0}
    attr = np.zeros(len(ids), "<u4")
    for n, more in episode_meta:
        key = json.dumps(more, sort_keys=True)
        if key not in codes:
            codes[key] = len(attrs)
            attrs.append(more)
        attr[n] = codes[key]
    return attrs, {"ids": col, "id_order": order, "attr": attr}


def from_json(data: dict) -> tuple[list[dict], dict[str, np.ndarray]]:
    """`build` of an index that lists its ids and attributes in its JSON (checked already): what it is read as."""
    return build(data["ids"], data["episode_meta"])


def check(w: Where, cols: Mapping[str, np.ndarray], attrs: Sequence[dict]) -> None:
    """Refuse, naming the episode or column, ids that are not tar-safe or repeat, an ``id_order`` that is not the
    permutation sorting them, or an ``attr`` code past ``attrs``: vectorised, `BLOCK` episodes at a time."""
    ids, order, attr = cols["ids"], cols["id_order"], cols["attr"]
    n, width = len(ids), ids.dtype.itemsize
    if n and not (attr.max() < len(attrs)):
        k = int(np.argmax(attr >= len(attrs)))
        raise w.fail(f"episode {k} (column 'attr')", f"its code {int(attr[k])} is not below the "
                                                     f"{len(attrs)} attrs the index lists")
    lens = np.strings.str_len(ids)  # up to the last non-NUL byte
    flat = ids.view(np.uint8)
    chars = all(_ALLOWED[flat[a:a + BLOCK * width]].all() for a in range(0, len(flat), BLOCK * width))
    # every byte before an id's end is non-NUL iff the non-NUL bytes are exactly the lengths' sum
    if n and (not chars or lens.min() == 0 or np.count_nonzero(flat) != int(lens.sum(dtype=np.int64))
              or np.strings.startswith(ids, b".").any() or np.strings.endswith(ids, b".").any()):
        for a in range(0, n, BLOCK):  # find the first bad one to name it
            b = ids[a:a + BLOCK].view(np.uint8).reshape(-1, width)
            nul = b == 0
            bad = ~_ALLOWED[b].all(axis=1) | nul[:, 0] | (nul[:, :-1] & ~nul[:, 1:]).any(axis=1) \
                | (b[:, 0] == ord(".")) | np.strings.endswith(ids[a:a + BLOCK], b".")
            if bad.any():
                k = a + int(np.argmax(bad))
                raise w.fail(f"episode {k} (column 'ids')", f"id {bytes(ids[k])!r} is not a tar-safe episode id "
                                                            "(letters, digits, '_', '-', '.')")
    if n and (order.min() < 0 or order.max() >= n):
        raise w.fail("column 'id_order'", f"it should hold the episode numbers 0 to {n - 1}")
    seen = np.zeros(n, bool)
    seen[order] = True
    if not seen.all():
        raise w.fail("column 'id_order'", f"episode {int(np.argmax(~seen))} is not in it: it should hold every "
                                          "episode number once")
    for a in range(0, max(n - 1, 0), BLOCK):
        s = ids[order[a:a + BLOCK + 1]]
        if not (s[1:] <= s[:-1]).any():
            continue
        same, down = s[1:] == s[:-1], s[1:] < s[:-1]
        if same.any():
            k = int(order[a + int(np.argmax(same))])
            raise w.fail(f"episode {id_text(ids, k)!r}", "this id appears twice; every episode needs its own id")
        raise w.fail("column 'id_order'", f"it does not sort the ids (at position {a + int(np.argmax(down))}); "
                                          "the ids are looked up through it")
    release(ids, order, attr)  # read whole: their pages are the page cache's again, not this process's

def id_text(ids: np.ndarray, n: int) -> str:
    """Episode ``n``'s id (checked ASCII) as text."""
    return bytes(ids[n]).decode("ascii")


def numbers(ids: np.ndarray, order: np.ndarray, wanted: Sequence[str]) -> np.ndarray:
    """The episode number of each id in ``wanted`` (int64), -1 for an id not in the index: one ``np.searchsorted``
    over the mapped ids (``order`` as its sorter), so nothing per episode is read or copied."""
    out = np.full(len(wanted), -1, np.int64)
    if not len(ids) or not len(wanted):
        return out
    width = ids.dtype.itemsize
    keys = np.zeros(len(wanted), ids.dtype)
    ok = np.zeros(len(wanted), bool)
    for k, eid in enumerate(wanted):
        raw = eid.encode("ascii", "replace") if isinstance(eid, str) else b""
        if 0 < len(raw) <= width and b"\0" not in raw and raw.isascii() and eid.isascii():
            keys[k], ok[k] = raw, True
    pos = np.minimum(np.searchsorted(ids, keys, sorter=order), len(ids) - 1)
    cand = order[pos]
    hit = ok & (ids[cand] == keys)
    out[hit] = cand[hit]
    return out


def near(ids: np.ndarray, order: np.ndarray, eid: str, k: int = 64) -> list[str]:
    """Up to ``2 * k`` ids around where ``eid`` would sort: candidates for an unknown id's close matches, read
    without listing every id."""
    if not len(ids):
        return []
    key = np.array([eid.encode("ascii", "replace")[:ids.dtype.itemsize]], ids.dtype)
    at = int(np.searchsorted(ids, key, sorter=order)[0])
    return [id_text(ids, int(n)) for n in order[max(at - k, 0):at + k]]


class IdList(Sequence[str]):
    """`EpisodeIndex.ids`: episode ``n``'s id is ``ids[n]``, decoded from the mapped column on access (a list of a
    million strings is what opening avoids)."""

    def __init__(self, ids: np.ndarray, order: np.ndarray) -> None:
        self._ids, self._order = ids, order

    def __len__(self) -> int:
        return len(self._ids)

    def raw(self, numbers: np.ndarray | slice) -> np.ndarray:
        """The ids of episodes ``numbers`` as the column holds them (``|S<width>``, NUL-padded, checked ASCII at
        open): what code handling many ids at once reads instead of a `str` each."""
        return self._ids[numbers]

    def __getitem__(self, n: int | slice) -> Any:
        if isinstance(n, slice):
            return [id_text(self._ids, k) for k in range(*n.indices(len(self._ids)))]
        return id_text(self._ids, range(len(self._ids))[n])

    def __iter__(self) -> Iterator[str]:
        return (id_text(self._ids, k) for k in range(len(self._ids)))

    def __contains__(self, eid: object) -> bool:
        return isinstance(eid, str) and int(numbers(self._ids, self._order, [eid])[0]) >= 0

    def index(self, eid: Any, start: int = 0, stop: int | None = None) -> int:
        n = int(numbers(self._ids, self._order, [eid])[0]) if isinstance(eid, str) else -1
        if n < 0 or not start <= n < (len(self) if stop is None else stop):
            raise ValueError(f"{eid!r} is not an episode id of this index")
        return n

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and len(other) == len(self) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"<{len(self)} episode ids>"


class EpisodeAttrs(Mapping[int, dict]):
    """`Tables.episode_meta`: episode number -> its attributes, for the episodes that have some, read from the
    ``attr`` codes (nothing is built per episode until asked)."""

    def __init__(self, attr: np.ndarray, attrs: Sequence[dict]) -> None:
        self._attr, self._attrs = attr, attrs
        self._empty = [k for k, a in enumerate(attrs) if not a]

    def _with(self) -> np.ndarray:
        return np.flatnonzero(~np.isin(self._attr, self._empty)) if self._empty else np.arange(len(self._attr))

    def __getitem__(self, n: int) -> dict:
        if not isinstance(n, int | np.integer) or not 0 <= n < len(self._attr):
            raise KeyError(n)
        got = self._attrs[int(self._attr[n])]
        if not got:
            raise KeyError(n)
        return got

    def __iter__(self) -> Iterator[int]:
        return iter(self._with().tolist())

    def __len__(self) -> int:
        return len(self._with()) if len(self._attrs) > len(self._empty) else 0
