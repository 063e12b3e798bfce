"""`FrameTable`: the flat frame numbers of a training epoch over episodes in order, and back to (episode, frame).

The epoch orders themselves are `permute` (the keyed elastic shuffle) and `block_order`; this table maps their
flat positions to frames, and its fingerprint is what every epoch's order depends on besides the seed.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import json
from collections.abc import Sequence

from episodepipes.pipes.plan import Item


class FrameTable:
    """Flat frame numbers ``0..n-1`` over episodes in order, and back to `Item` (episode, frame)."""

    def __init__(self, ids: Sequence[str], lengths: Sequence[int]) -> None:
        if len(ids) != len(lengths):
            raise ValueError(f"{len(ids)} episode ids but {len(lengths)} lengths")
        self.ids = list(ids)
        self.starts = [0, *itertools.accumulate(int(n) for n in lengths)]  # a list: bisect beats numpy per lookup

    def __len__(self) -> int:
        return self.starts[-1]

    def fingerprint(self) -> str:
        """A digest of the episode ids and lengths in order: what every epoch's order depends on besides the seed
        (re-sharding the same episodes keeps it, another episode list or length changes it)."""
        lengths = [b - a for a, b in itertools.pairwise(self.starts)]
        return hashlib.sha256(json.dumps([self.ids, lengths]).encode()).hexdigest()[:16]

    def locate(self, flat: int) -> tuple[int, int]:
        """(episode position, frame) of a flat frame number."""
        if not 0 <= flat < len(self):
            raise IndexError(f"frame number {flat} is outside [0, {len(self)})")
        e = bisect.bisect_right(self.starts, flat) - 1
        return e, flat - self.starts[e]

    def item(self, flat: int) -> Item:
        e, f = self.locate(flat)
        return Item(self.ids[e], f)
