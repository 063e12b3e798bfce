"""Synthetic but realistic episodes: a textured scene panned past two cameras, with a moving
end-effector, per-step state/action arrays and a prompt. Used by the demo, tests and benchmarks."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import cv2
import numpy as np

from episodepipes.sharding.episode import EpisodeData

PROMPTS = ["pick up the red block", "open the drawer", "push the cup to the left", "stack the blocks",
           "wipe the table", "place the sponge in the bin"]


def _texture(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """Smooth noise plus shapes: compresses like a real scene, not like white noise."""
    base = rng.integers(0, 255, (h // 16 + 2, w // 16 + 2, 3), dtype=np.uint8)
    tex = cv2.resize(base, (w * 2, h * 2), interpolation=cv2.INTER_CUBIC)
    for _ in range(12):
        c = tuple(int(x) for x in rng.integers(0, 255, 3))
        p = (int(rng.integers(0, w * 2)), int(rng.integers(0, h * 2)))
        cv2.circle(tex, p, int(rng.integers(8, max(9, h // 4))), c, -1)
    return tex


@dataclass(frozen=True)
class SyntheticReader:
    """`EpisodeReader` over generated episodes, deterministic from ``seed``: data without source files.

    Episodes are ``ep0000``, ``ep0001``, ...; every third one (``ep0002``, ``ep0005``, ...) is in "val".
    Each has arrays ``state`` and ``action`` (7 floats per step) and ``keypoints`` (one ``(x, y)`` point
    per step, in pixels of every camera), and a prompt.

    Attributes:
        num_episodes: how many episodes.
        length: frames per episode, unless ``lengths`` is given.
        height, width: frame size of every camera.
        cameras: camera names.
        fps: frame rate recorded for every episode.
        seed: seed of the scenes and trajectories; the same seed gives the same episodes.
        lengths: per-episode frame counts (one per episode), overriding ``length``.
    """

    num_episodes: int = 6
    length: int = 40
    height: int = 96
    width: int = 128
    cameras: tuple[str, ...] = ("front", "wrist")
    fps: float = 10.0
    seed: int = 0
    lengths: tuple[int, ...] | None = None  # per-episode lengths, overriding `length`

    def episode_ids(self) -> list[str]:
        return [f"ep{i:04d}" for i in range(self.num_episodes)]

    def _len(self, i: int) -> int:
        return self.lengths[i] if self.lengths else self.length

    def read(self, episode_id: str) -> EpisodeData:
        i = int(episode_id[2:])
        n = self._len(i)
        rng = np.random.default_rng([self.seed, i])
        t = np.arange(n, dtype=np.float32) / max(n - 1, 1)
        phase = rng.uniform(0, 2 * np.pi)
        xy = np.stack([0.5 + 0.35 * np.cos(2 * np.pi * t + phase), 0.5 + 0.35 * np.sin(2 * np.pi * t + phase)], 1)
        state = np.concatenate([xy, rng.normal(size=(n, 5)).cumsum(0) * 0.05], 1).astype(np.float32)
        action = np.diff(state, axis=0, append=state[-1:]).astype(np.float32)
        keypoints = (xy[:, None, :] * np.array([self.width, self.height], np.float32)).astype(np.float32)
        cams = {c: _frames(self, i, k, xy) for k, c in enumerate(self.cameras)}
        return EpisodeData(
            id=episode_id, cameras=cams,
            arrays={"state": state, "action": action, "keypoints": keypoints.reshape(n, 1, 2)},
            fps=self.fps, prompt=PROMPTS[i % len(PROMPTS)], split="val" if i % 3 == 2 else "train",
        )


def _frames(r: SyntheticReader, i: int, cam: int, xy: np.ndarray) -> Iterator[np.ndarray]:
    rng = np.random.default_rng([r.seed, i, cam])
    tex = _texture(rng, r.height, r.width)
    for k, (x, y) in enumerate(xy):
        ox = int((np.sin(k * 0.07 + cam) * 0.5 + 0.5) * r.width)
        oy = int((np.cos(k * 0.05 + cam) * 0.5 + 0.5) * r.height)
        frame = np.ascontiguousarray(tex[oy:oy + r.height, ox:ox + r.width])
        cv2.circle(frame, (int(x * r.width), int(y * r.height)), max(3, r.height // 12), (230, 40, 40), -1)
        yield frame
