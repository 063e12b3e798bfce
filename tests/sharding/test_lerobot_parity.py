"""The parity check's comparison: a frame counts as equal only when both sides hold it byte-equal."""

from __future__ import annotations

import numpy as np

from benchmarks.lerobot_parity import compare


def test_compare_counts_equal_differing_missing_and_extra_frames():
    rng = np.random.default_rng(0)
    frame = {k: rng.integers(0, 256, (4, 6, 3), dtype=np.uint8) for k in range(4)}
    want = {(0, t, "front"): frame[t] for t in range(3)}
    off = frame[1].copy()
    off[2, 3, 1] ^= 7  # a difference of 7 or less in one byte
    got = {(0, 0, "front"): frame[0].copy(), (0, 1, "front"): off, (0, 3, "front"): frame[3]}
    c = compare(want, got)
    assert c == {"equal": 1, "of": 4, "missing": 1, "extra": 1, "max_diff": int(abs(int(off[2, 3, 1]) -
                                                                                 int(frame[1][2, 3, 1])))}
    assert compare(want, {k: v.copy() for k, v in want.items()}) == {"equal": 3, "of": 3, "missing": 0, "extra": 0,
                                                                      "max_diff": 0}
    assert compare(want, {})["max_diff"] is None
