"""`draw_overlay`: the default render hook: episode id and frame number, plus predicted points and trajectories.

Outputs are read if ``validation_step`` returns a mapping with (pixel coordinates, ``x, y``):
``"points"`` ``[B, N, 2]`` (or ``[B, 2]``) drawn as dots, and ``"trajectories"`` ``[B, T, 2]`` (or
``[B, K, T, 2]``) drawn as polylines. Anything else in the outputs is ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import cv2
import numpy as np
import torch

POINT = (255, 60, 60)  # RGB
TRAJECTORY = (60, 220, 255)
TEXT = (255, 255, 255)


def as_numpy(x: Any) -> np.ndarray:
    """A tensor or array-like as a float numpy array on the CPU."""
    if isinstance(x, torch.Tensor):
        x = x.detach().float().cpu().numpy()
    return np.asarray(x, dtype=np.float64)


def _per_sample(outputs: Any, key: str, batch_size: int, ndim: int) -> np.ndarray | None:
    """``outputs[key]`` shaped ``[B, ..., 2]`` with ``ndim`` dims (a missing middle axis added), or None."""
    if not isinstance(outputs, Mapping) or outputs.get(key) is None:
        return None
    a = as_numpy(outputs[key])
    if a.ndim == ndim - 1:
        a = a[:, None]
    if a.ndim != ndim or a.shape[0] != batch_size or a.shape[-1] != 2:
        raise ValueError(f"outputs[{key!r}] has shape {a.shape}; expected [B={batch_size}, ..., 2] in pixels "
                         f"with {ndim} dims (or {ndim - 1})")
    return a


def draw_overlay(frames: np.ndarray, batch: Mapping[str, Any], outputs: Any) -> np.ndarray:
    """Draw on uint8 RGB ``[B, H, W, 3]`` frames (in place) and return them."""
    b, h, w = frames.shape[:3]
    points = _per_sample(outputs, "points", b, 3)
    trajs = _per_sample(outputs, "trajectories", b, 4)
    scale = max(0.3, w / 640)  # OpenCV font scale: ~13 px tall text on a 640 px wide frame
    thick = max(1, round(w / 320))
    frame_ids = as_numpy(batch["frame"]).astype(int) if "frame" in batch else np.arange(b)
    for i in range(b):
        img = frames[i]
        if trajs is not None:
            for line in trajs[i]:
                pts = np.round(line).astype(np.int32).reshape(-1, 1, 2)
                cv2.polylines(img, [pts], False, TRAJECTORY, thick, cv2.LINE_AA)
        if points is not None:
            for x, y in points[i]:
                if np.isfinite(x) and np.isfinite(y):
                    cv2.circle(img, (round(x), round(y)), max(2, w // 80), POINT, -1, cv2.LINE_AA)
        label = f"{batch['episode'][i]}  f{frame_ids[i]}"
        org = (4, max(10, round(28 * scale)))
        cv2.putText(img, label, org, cv2.FONT_HERSHEY_SIMPLEX, scale, (0, 0, 0), thick + 2, cv2.LINE_AA)
        cv2.putText(img, label, org, cv2.FONT_HERSHEY_SIMPLEX, scale, TEXT, thick, cv2.LINE_AA)
    return frames
