"""Pure planning functions for a shard write: option parsing, split assignment, job blocks."""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence

import numpy as np

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "k": 10**3, "m": 10**6, "g": 10**9}
JPEG_MAX = 65500  # libjpeg's limit on either side
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str) -> int:
    """Bytes in ``"512MB"``, ``"1.5GiB"``, ``"100000"`` (decimal units, binary with an ``i``)."""
    m = _SIZE.match(str(text))
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS:
        raise ValueError(f"shard size {text!r} is not a size; write e.g. 512MB, 2GiB or 100000")
    size = int(float(m.group(1)) * _UNITS[unit])
    if size < 1:
        raise ValueError(f"shard size {text!r} must be at least 1 byte")
    return size


def parse_resize(text: str | None) -> tuple[int, int] | None:
    """``"224x224"`` (height x width) -> (224, 224)."""
    if text is None:
        return None
    m = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", text)
    if m is None or min(int(m.group(1)), int(m.group(2))) < 1:
        raise ValueError(f"--resize {text!r} is not HxW; write e.g. --resize 224x224 (height x width)")
    if max(int(m.group(1)), int(m.group(2))) > JPEG_MAX:
        raise ValueError(f"--resize {text!r}: JPEG frames are at most {JPEG_MAX} pixels a side; pass a smaller size")
    return int(m.group(1)), int(m.group(2))


def assign_splits(ids: Sequence[str], *, val_fraction: float | None = None,
                  val_episodes: Sequence[str] | None = None, seed: int = 0) -> dict[str, str | None]:
    """Split per episode id; None means "take it from the episode's metadata".

    ``val_fraction`` picks ``round(fraction * len(ids))`` episodes with a generator seeded by
    ``seed`` over the sorted id list, so every job of a multi-job run picks the same set.
    """
    if val_fraction is not None and val_episodes is not None:
        raise ValueError("pass --val-fraction or --val-episodes, not both")
    if val_fraction is not None:
        if not 0.0 <= val_fraction <= 1.0:
            raise ValueError(f"{val_fraction=} must be within [0, 1]")
        n_val = round(val_fraction * len(ids))
        chosen = set(np.random.default_rng(seed).permutation(len(ids))[:n_val].tolist())
        return {eid: "val" if i in chosen else "train" for i, eid in enumerate(ids)}
    if val_episodes is not None:
        known = set(ids)
        for eid in val_episodes:
            if eid not in known:
                close = difflib.get_close_matches(eid, list(ids), n=3)
                raise ValueError(f"--val-episodes: no episode {eid!r} in the source; close matches: {close or 'none'}")
        val = set(val_episodes)
        return {eid: "val" if eid in val else "train" for eid in ids}
    return dict.fromkeys(ids)


def job_block(n: int, *, num_jobs: int, job_index: int) -> range:
    """Positions of the sorted episode list that job ``job_index`` of ``num_jobs`` shards (contiguous)."""
    if num_jobs < 1:
        raise ValueError(f"{num_jobs=} must be >= 1")
    if not 0 <= job_index < num_jobs:
        raise ValueError(f"{job_index=} must be in [0, {num_jobs - 1}] for {num_jobs=}")
    return range(job_index * n // num_jobs, (job_index + 1) * n // num_jobs)
