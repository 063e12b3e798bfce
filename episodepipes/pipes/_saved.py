"""The check a position from a saved state passes before a reader resumes at it (the state may come from any
checkpoint file, so a value is checked against the pass it is loaded into, never trusted)."""

from __future__ import annotations

import numbers
from typing import Any


def saved_position(pos: Any, *, end: int) -> int:
    """``pos``, checked to be a position of a pass of ``end`` items: an int in ``[0, end]`` (a negative one would
    read the pass's tail, one past ``end`` an empty pass; a bool or a float is not a position)."""
    if isinstance(pos, bool) or not isinstance(pos, numbers.Integral) or not 0 <= pos <= end:
        raise ValueError(f"the saved pipe state has pos={pos!r}, not an int in [0, {end}] (the {end} items of this "
                         "pipe's pass); pass the state_dict() of a pipe built with the same arguments")
    return int(pos)
