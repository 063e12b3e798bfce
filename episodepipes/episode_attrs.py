"""Episode attributes: the extra per-episode metadata (raw ``meta.json`` keys, zarr attrs, LeRobot's
``robot_type``) that the writer carries into the index, `Episode.meta` returns and ``where=`` sees.

One rule for both sides: the writer refuses what the index check would refuse, so a dataset that writes
also opens. An index is data from strangers, so its attributes are bounded (keys, text length, integer
range) and flat: one JSON scalar per key, never a list or an object to walk.
"""

from __future__ import annotations

import math
import unicodedata
from typing import Any

BUILTIN = ("id", "split", "length", "fps", "prompt", "cameras", "arrays", "segments")  # an episode's own fields
MAX_KEYS = 64
MAX_KEY_CHARS = 128
MAX_TEXT_CHARS = 1024
MAX_INT = 2**63  # an attribute integer is an int64, exact in every consumer that parses it


def problem(attrs: Any) -> str | None:
    """Why ``attrs`` cannot be an episode's attributes (a phrase naming the key), or None when it can."""
    if not isinstance(attrs, dict):
        return f"should be an object of attribute -> value, found {type(attrs).__name__}"
    if len(attrs) > MAX_KEYS:
        return f"has {len(attrs)} attributes, more than {MAX_KEYS}; keep the ones to select episodes by"
    for k, v in attrs.items():
        if not isinstance(k, str) or not 0 < len(k) <= MAX_KEY_CHARS:
            return f"attribute name {str(k)[:40]!r} should be text of 1 to {MAX_KEY_CHARS} characters"
        if not (k.isascii() and k.isprintable()) and (  # the common case, checked in C
                not unicodedata.is_normalized("NFC", k) or any(unicodedata.category(c) == "Cc" for c in k)):
            return (f"attribute name {ascii(k[:40])} should be NFC-normalised text without control characters (two "
                    "spellings of one name would select differently); normalise it")
        if k in BUILTIN:
            return f"attribute {k!r} is a built-in episode field ({', '.join(BUILTIN)}); rename it"
        if v is None or isinstance(v, bool):
            continue
        if isinstance(v, int):
            if not -MAX_INT <= v < MAX_INT:
                return f"attribute {k!r} is an integer outside the int64 range; store it as text"
        elif isinstance(v, float):
            if not math.isfinite(v):
                return f"attribute {k!r}={v!r} is not a finite number"
        elif isinstance(v, str):
            if len(v) > MAX_TEXT_CHARS:
                return f"attribute {k!r} holds {len(v)} characters, more than {MAX_TEXT_CHARS}; shorten it"
        else:
            return (f"attribute {k!r} is a {type(v).__name__}; an attribute holds one string, number, boolean or "
                    "null (flatten structured values into keys of their own)")
    return None
