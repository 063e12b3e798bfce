"""Demo data: realistic episodes written in the raw-folder layout that `shard.py write` reads.

Two cameras per episode as real mp4 files, ``arrays.npz`` with state/action/keypoints and a
``meta.json`` with fps, prompt and split, so the demo exercises the same reader a user's data takes.
"""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np

from episodepipes.sharding.formats.synthetic import SyntheticReader


def write_raw_episodes(dst: Path, reader: SyntheticReader) -> Path:
    """Write every episode of ``reader`` under ``dst/<episode_id>/``; returns ``dst``."""
    for eid in reader.episode_ids():
        ep = reader.read(eid)
        d = dst / eid
        d.mkdir(parents=True, exist_ok=True)
        for cam, frames in ep.cameras.items():
            out = cv2.VideoWriter(str(d / f"{cam}.mp4.tmp.mp4"), cv2.VideoWriter_fourcc(*"mp4v"), ep.fps,
                                  (reader.width, reader.height))
            for f in frames:
                out.write(cv2.cvtColor(f, cv2.COLOR_RGB2BGR))
            out.release()
            (d / f"{cam}.mp4.tmp.mp4").replace(d / f"{cam}.mp4")
        np.savez(d / "arrays.npz", **ep.arrays)
        (d / "meta.json").write_text(json.dumps({"fps": ep.fps, "prompt": ep.prompt, "split": ep.split}))
    return dst
