"""`RawSample`: one planned item's undecoded bytes, as a reader hands them to the `Decoder`.

A training sample with history/horizon windows carries each windowed key as a `StepWindow` (the
member of every window step, which steps are padding), not as extra members with magic names.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field

from episodepipes.pipes.plan import Item


@dataclass(frozen=True)
class StepWindow:
    """One windowed key of a sample.

    Attributes:
        steps: the episode step each window position shows, clamped into the episode (padding repeats
            the nearest real step, so a step may appear more than once: it is decoded once).
        pad: per position, True where it lies outside the episode (the sample's ``<key>_pad`` mask).
        data: step -> that step's member bytes; empty in a damaged sample.
        borrowed: steps whose frame an earlier sample of the batch decodes (no bytes in ``data``): the
            worker leaves their rows alone and the `Decoder` copies them in (`_batchmemo`).
    """

    steps: tuple[int, ...]
    pad: tuple[bool, ...]
    data: Mapping[int, bytes] = field(default_factory=dict)
    borrowed: frozenset[int] = frozenset()


@dataclass
class RawSample:
    """One planned item's undecoded members, as a reader hands them to `Decoder`.

    Attributes:
        item: the planned item (episode, frame, valid).
        shard: the shard file's name, for messages.
        members: field (``"front.jpg"``, ``"state.npy"``, ``"json"``) -> bytes of the item's own step; a
            windowed key's field is not here but in ``windows``.
        damaged: why the frame's bytes are not the ones written (``"crc32 mismatch"``), or None. A damaged
            sample is corrupt as a whole: the decoder zeroes it, marks it valid=False, counts and names it.
        windows: windowed key -> its `StepWindow` (training samples with ``history``/``horizon`` only).
        borrowed: cameras whose frame of this step an earlier sample of the batch decodes (see
            `StepWindow.borrowed`).
        checks: ``(step, whole frame bytes, crc32)`` of frames the decode worker checks against the index's
            crc32 before decoding (`crc_mismatch`); a mismatch makes the sample damaged there.
    """

    item: Item
    shard: str
    members: dict[str, bytes]
    damaged: str | None = None
    windows: dict[str, StepWindow] = field(default_factory=dict)
    borrowed: frozenset[str] = frozenset()
    checks: tuple[tuple[int, bytes, int], ...] = ()


def crc_mismatch(checks: tuple[tuple[int, bytes, int], ...]) -> str | None:
    """Why the first frame of ``checks`` whose bytes differ from their crc32 is damaged, or None."""
    for step, data, crc in checks:
        if zlib.crc32(data) != crc:
            return f"frame {step} does not match its crc32 in the index"
    return None
