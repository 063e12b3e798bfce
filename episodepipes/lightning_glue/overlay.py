"""`draw_overlay`: the default render hook: episode id and frame number, predictions, ground truth, a legend.

Outputs are read if ``validation_step`` returns a mapping with (pixel coordinates, ``x, y``):
``"points"`` ``[B, N, 2]`` (or ``[B, 2]``) drawn as dots, and ``"trajectories"`` ``[B, T, 2]`` (or
``[B, K, T, 2]``) drawn as polylines. Anything else in the outputs is ignored. Ground truth is the batch's
array ``gt_key`` (same shapes as ``"points"``, in pixels), drawn as crosses in a second colour; a ``gt_key``
with a window (``history=``/``horizon=`` on the video pipe: ``[B, W, 2]`` or ``[B, W, N, 2]`` and its mask
``<gt_key>_pad``) is drawn as a polyline per point through its steps inside the episode, a cross at each.

With several cameras, `tile_cameras` puts them side by side, the first at the left; coordinates are the
first camera's pixels, so they stay valid on the tiled frame.
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
GROUND_TRUTH = (60, 255, 60)


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


def draw_overlay(frames: np.ndarray, batch: Mapping[str, Any], outputs: Any, *,
                 gt_key: str | None = None) -> np.ndarray:
    """Draw on uint8 RGB ``[B, H, W, 3]`` frames (in place) and return them.

    Args:
        frames: the frames to draw on (a tiling of cameras is fine: coordinates are the first camera's).
        batch: the video batch (``episode``, ``frame`` and ``gt_key`` are read).
        outputs: what ``validation_step`` returned (``points``, ``trajectories``; optional).
        gt_key: the batch's array of ground-truth points in pixels, e.g. ``"keypoints"`` (None: no ground truth).
    """
    b, h, w = frames.shape[:3]
    points = _per_sample(outputs, "points", b, 3)
    trajs = _per_sample(outputs, "trajectories", b, 4)
    gt = gt_lines = None
    if gt_key is not None:
        if gt_key not in batch:
            raise KeyError(f"gt_key={gt_key!r} is not in the video batch; arrays there: "
                           f"{sorted(k for k in batch if k not in ('episode', 'frame', 'valid'))}")
        gt, gt_lines = _ground_truth(batch, gt_key, b)
    scale = max(0.3, h / 480)  # OpenCV font scale: ~13 px tall text on a 480 px high frame
    thick = max(1, round(h / 240))
    radius = max(2, h // 60)
    frame_ids = as_numpy(batch["frame"]).astype(int) if "frame" in batch else np.arange(b)
    legend = [(n, c, m) for n, c, m, a in (("pred", POINT, "dot", points), (f"gt {gt_key}", GROUND_TRUTH, "cross", gt))
              if a is not None]
    for i in range(b):
        img = frames[i]
        if trajs is not None:
            for line in trajs[i]:
                pts = np.round(line).astype(np.int32).reshape(-1, 1, 2)
                cv2.polylines(img, [pts], False, TRAJECTORY, thick, cv2.LINE_AA)
        if points is not None:
            for x, y in points[i]:
                if np.isfinite(x) and np.isfinite(y):
                    _mark(img, (round(x), round(y)), POINT, "dot", radius, thick)
        if gt_lines is not None:
            for line in gt_lines[i]:
                pts = np.round(line).astype(np.int32).reshape(-1, 1, 2)
                cv2.polylines(img, [pts], False, GROUND_TRUTH, thick, cv2.LINE_AA)
        if gt is not None:  # after the predictions: a cross stays visible on a dot at the same place
            for x, y in gt[i]:
                if np.isfinite(x) and np.isfinite(y):
                    _mark(img, (round(x), round(y)), GROUND_TRUTH, "cross", radius, thick)
        _text_inside(img, f"{batch['episode'][i]}  f{frame_ids[i]}", 4, max(10, round(28 * scale)), scale, thick)
        for k, (name, colour, marker) in enumerate(reversed(legend)):  # bottom-left, one line per entry
            y = h - 6 - k * max(12, round(30 * scale))
            _mark(img, (4 + radius, y - radius), colour, marker, radius, thick)
            _text_inside(img, name, 10 + 2 * radius, y, scale, thick)
    return frames


def _ground_truth(batch: Mapping[str, Any], key: str, b: int) -> tuple[Any, list[list[np.ndarray]] | None]:
    """(the points to mark per sample, the polylines per sample or None) of the batch's array ``key``: a window
    (``<key>_pad`` in the batch) gives each point's steps inside the episode as a line, and marks them all."""
    pad = batch.get(f"{key}_pad")
    if pad is None:
        return _per_sample({key: batch[key]}, key, b, 3), None
    a = as_numpy(batch[key])
    a = a[:, :, None] if a.ndim == 3 else a
    keep = ~as_numpy(pad).astype(bool)
    if a.ndim != 4 or a.shape[0] != b or a.shape[-1] != 2 or keep.shape != a.shape[:2]:
        raise ValueError(f"batch[{key!r}] is a window of shape {a.shape} (mask {keep.shape}); expected "
                         f"[B={b}, W, 2] or [B, W, N, 2] in pixels, with a [B, W] mask")
    lines = [[a[i, keep[i], n] for n in range(a.shape[2])] for i in range(b)]
    return [a[i, keep[i]].reshape(-1, 2) for i in range(b)], lines


def with_index_names(batch: Mapping[str, Any], episode: Any) -> dict[str, Any]:
    """``batch`` with each camera and array of ``episode`` (an `Episode` of the pipe's index) also under its index
    name, and its window mask as ``<name>_pad``, where the pipe named them by the source (``names="lerobot"``:
    ``observation.images.top``, ``action_is_pad``); so ``cameras=`` and ``gt_key=`` stay the index's names.
    Keys already in the batch are kept as they are; the values are the same tensors."""
    out = dict(batch)
    for key, spec in [*episode.cameras.items(), *episode.arrays.items()]:
        if key not in out and spec.source in batch:
            out[key] = batch[spec.source]
        if f"{key}_pad" not in out and f"{spec.source}_is_pad" in batch:
            out[f"{key}_pad"] = batch[f"{spec.source}_is_pad"]
    return out


def tile_cameras(views: list[np.ndarray], names: list[str]) -> np.ndarray:
    """Camera frames ``[B, H_i, W_i, 3]`` side by side (left to right, shorter ones padded black at the bottom),
    each labelled with its camera name at its top right."""
    if len(views) == 1:
        return views[0]
    hmax = max(v.shape[1] for v in views)
    tiles = [np.pad(v, ((0, 0), (0, hmax - v.shape[1]), (0, 0), (0, 0))) for v in views]
    out = np.ascontiguousarray(np.concatenate(tiles, axis=2))
    scale, thick = max(0.3, hmax / 480), max(1, round(hmax / 240))
    x0 = 0
    for v, name in zip(views, names):
        x0 += v.shape[2]
        (tw, _), _ = cv2.getTextSize(name, cv2.FONT_HERSHEY_SIMPLEX, scale, thick)
        for img in out:
            _text(img, name, (max(0, x0 - tw - 4), hmax - 6), scale, thick)
    return out


def _mark(img: np.ndarray, xy: tuple[int, int], colour: tuple[int, int, int], marker: str, radius: int,
          thick: int) -> None:
    if marker == "dot":
        cv2.circle(img, xy, radius, colour, -1, cv2.LINE_AA)
    else:  # a cross with exact colour at its centre (no antialiasing)
        cv2.drawMarker(img, xy, colour, cv2.MARKER_CROSS, 2 * radius + 3, thick, cv2.LINE_8)


def ink_span(text: str, scale: float, thick: int) -> tuple[int, int]:
    """The first and last pixel columns, relative to the origin's x, that `_text` inks for ``text`` (its outline
    included): a glyph may reach left of the origin (``j``'s descender) and past ``getTextSize``'s width."""
    (tw, th), base = cv2.getTextSize(text, cv2.FONT_HERSHEY_SIMPLEX, scale, thick + 2)
    pad = th + base + thick + 4
    canvas = np.zeros((th + base + 2 * pad, tw + 2 * pad), np.uint8)
    cv2.putText(canvas, text, (pad, pad + th), cv2.FONT_HERSHEY_SIMPLEX, scale, 255, thick + 2, cv2.LINE_AA)
    cols = np.flatnonzero(canvas.any(axis=0))
    return (int(cols[0]) - pad, int(cols[-1]) - pad) if cols.size else (0, 0)


def _text_inside(img: np.ndarray, text: str, x: int, y: int, scale: float, thick: int, margin: int = 1) -> None:
    """`_text` at ``(x, y)``, moved right until its ink clears the left edge by ``margin`` columns, and drawn
    smaller when it would not fit the frame's width: a label is never cut at either edge."""
    width = img.shape[1] - 2 * margin
    first, last = ink_span(text, scale, thick)
    if last - first + 1 > width and width > 0:  # too wide: shrink (the span scales with the font, near enough)
        for _ in range(4):
            scale *= width / (last - first + 1)
            first, last = ink_span(text, scale, thick)
            if last - first + 1 <= width:
                break
    _text(img, text, (max(x, margin - first), y), scale, thick)


def _text(img: np.ndarray, text: str, org: tuple[int, int], scale: float, thick: int) -> None:
    cv2.putText(img, text, org, cv2.FONT_HERSHEY_SIMPLEX, scale, (0, 0, 0), thick + 2, cv2.LINE_AA)
    cv2.putText(img, text, org, cv2.FONT_HERSHEY_SIMPLEX, scale, TEXT, thick, cv2.LINE_AA)
