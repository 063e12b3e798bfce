"""`FrameTable`: the flat frame numbers of a training epoch over episodes in order, and back to (episode, frame).

The epoch orders themselves are `permute` (the keyed elastic shuffle) and `block_order`; this table maps their
flat positions to frames, and its fingerprint is what every epoch's order depends on besides the seed. It holds
one int64 per episode (the cumulative lengths) and the ids as given (a list, or a lazy view of an index's), so
nothing per frame, nor a Python object per episode, is made.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

import numpy as np

from episodepipes.pipes.plan import Item

_CHUNK = 1 << 16  # episodes encoded at a time by `FrameTable.fingerprint`


class FrameTable:
    """Flat frame numbers ``0..n-1`` over episodes in order, and back to `Item` (episode, frame)."""

    def __init__(self, ids: Sequence[str], lengths: Sequence[int] | np.ndarray) -> None:
        lengths = np.asarray(lengths).ravel()  # a view of an index's column, or a list
        if len(ids) != len(lengths):
            raise ValueError(f"{len(ids)} episode ids but {len(lengths)} lengths")
        self.ids = ids
        self.starts = np.zeros(len(lengths) + 1, np.int64)  # each episode's first flat frame, then n
        np.cumsum(lengths, dtype=np.int64, out=self.starts[1:])
        self.starts.flags.writeable = False
        self._n = int(self.starts[-1])
        self._fingerprint: str | None = None

    def __len__(self) -> int:
        return self._n

    def fingerprint(self) -> str:
        """A digest of the episode ids and lengths in order: what every epoch's order depends on besides the seed
        (re-sharding the same episodes keeps it, another episode list or length changes it).

        The sha256 of ``json.dumps([ids, lengths])``, encoded a chunk of episodes at a time (no whole copy), once
        (a reader's state and a mixture's both record it)."""
        if self._fingerprint is None:
            self._fingerprint = self._digest()
        return self._fingerprint

    def _digest(self) -> str:
        h = hashlib.sha256(b"[[")
        n = len(self.ids)
        for a in range(0, n, _CHUNK):
            part = _json_ids(self.ids, a, min(a + _CHUNK, n))
            h.update((b", " if a else b"") + part)
        h.update(b"], [")
        lengths = np.diff(self.starts)
        for a in range(0, n, _CHUNK):
            h.update((", " if a else "").encode() + str(lengths[a:a + _CHUNK].tolist())[1:-1].encode())  # json's ints
        h.update(b"]]")
        return h.hexdigest()[:16]

    def locate(self, flat: int) -> tuple[int, int]:
        """(episode position, frame) of a flat frame number."""
        if not 0 <= flat < self._n:
            raise IndexError(f"frame number {flat} is outside [0, {self._n})")
        e = int(self.starts.searchsorted(flat, side="right")) - 1
        return e, int(flat - self.starts[e])

    def item(self, flat: int) -> Item:
        e, f = self.locate(flat)
        return Item(self.ids[e], f)


_ESCAPED = np.zeros(256, bool)  # bytes json.dumps writes otherwise than as themselves (ASCII ids; DEL is \u007f)
_ESCAPED[1:0x20] = _ESCAPED[ord('"')] = _ESCAPED[ord("\\")] = _ESCAPED[0x7f:] = True


def _json_ids(ids: Sequence[str], a: int, b: int) -> bytes:
    """``json.dumps(list(ids[a:b]))[1:-1]``, encoded: from the index's id column at once where ``ids`` reads it
    (`episodepipes.pipes.chosen`'s ids; a `str` per id costs seconds at 10**6 episodes) and no id needs json's
    escapes, else through json."""
    raw = getattr(ids, "raw", None)
    col = raw(a, b) if callable(raw) else None
    if col is not None and len(col) == b - a and col.dtype.kind == "S" and col.dtype.itemsize:
        grid = np.ascontiguousarray(col).view(np.uint8).reshape(len(col), col.dtype.itemsize)
        inner_nul = ((grid[:, :-1] == 0) & (grid[:, 1:] != 0)).any()  # NUL padding ends an id; one inside is escaped
        if not inner_nul and not _ESCAPED[grid].any():
            return b'"' + b'", "'.join(col.tolist()) + b'"'
    return json.dumps(list(ids[a:b]))[1:-1].encode()
