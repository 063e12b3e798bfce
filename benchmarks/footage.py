"""Real footage for the train, decode and peers benchmarks: Debian's media packages cut into robot-like episodes.

Generated frames flatter a JPEG decoder (smooth texture, few edges); these clips do not. The clips are
``opencv-doc``'s vtest.avi (768x576 street scene) and Megamind.avi (720x528 animation) and ``python3-imageio``'s
cockatoo.mp4 (1280x720), installed with apt-get when missing (as `benchmarks.bench_codec` does). Episode ``e``
shows clip ``e % 3`` on its ``front`` camera and clip ``(e + 1) % 3`` on its ``wrist`` camera, each from an offset
that moves with ``e``, centre-cropped to the target aspect and resized (INTER_AREA); ``state`` and ``action`` are 7
floats a step. The same episodes are sharded by our writer (JPEG q90) and handed to every other loader.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from episodepipes.index import EpisodeIndex
from episodepipes.sharding.episode import EpisodeData

CLIPS = (("opencv-doc", "vtest.avi"), ("opencv-doc", "Megamind.avi"), ("python3-imageio", "cockatoo.mp4"))
FPS = 10.0


def clip_paths() -> tuple[str, ...]:
    """The three clips' paths, installing their Debian packages first where they are missing."""
    paths = []
    for pkg, name in CLIPS:
        listed = subprocess.run(["dpkg", "-L", pkg], capture_output=True, text=True).stdout
        if f"/{name}" not in listed and shutil.which("apt-get"):
            subprocess.run(["apt-get", "install", "-y", "-q", pkg], check=True, capture_output=True)
            listed = subprocess.run(["dpkg", "-L", pkg], capture_output=True, text=True).stdout
        hits = [line for line in listed.splitlines() if line.endswith("/" + name)]
        if not hits:
            raise SystemExit(f"{name} not found in package {pkg}; install it with: apt-get install -y {pkg}")
        paths.append(hits[0])
    return tuple(paths)


def _fit(frame: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """``frame`` centre-cropped to the aspect of ``size`` (H, W), then resized to it."""
    h, w = frame.shape[:2]
    th, tw = size
    if h * tw > w * th:  # too tall
        ch = w * th // tw
        frame = frame[(h - ch) // 2:(h - ch) // 2 + ch]
    else:
        cw = h * tw // th
        frame = frame[:, (w - cw) // 2:(w - cw) // 2 + cw]
    return cv2.resize(frame, (tw, th), interpolation=cv2.INTER_AREA)


def clip_frames(path: str, start: int, count: int, size: tuple[int, int]) -> Iterator[np.ndarray]:
    """``count`` BGR frames of ``path`` from frame ``start``, played back and forth where the clip ends."""
    cap = cv2.VideoCapture(path)
    frames: list[np.ndarray] = []
    try:
        total = int(cap.get(cv2.CAP_PROP_FRAME_COUNT))
        span = min(total, start + count)
        k = 0
        while k < span:
            ok, f = cap.read()
            if not ok:
                break
            if k >= start or start + count > total:  # a short tail: keep from where the bounce needs it
                frames.append(_fit(f, size))
            k += 1
    finally:
        cap.release()
    if not frames:
        raise SystemExit(f"{path}: no frames decoded; is FFmpeg support in OpenCV missing?")
    if start + count > total:
        frames = frames[max(0, len(frames) - count):]
    bounce = frames + frames[-2:0:-1] if len(frames) > 1 else frames
    for i in range(count):
        yield bounce[i % len(bounce)]


@dataclass(frozen=True)
class FootageReader:
    """`EpisodeReader` of ``episodes`` train episodes of ``length`` steps at ``size`` (H, W) from `clip_paths`."""

    clips: tuple[str, ...]
    episodes: int = 24
    length: int = 150
    size: tuple[int, int] = (224, 224)

    def episode_ids(self) -> list[str]:
        return [f"ep{e:04d}" for e in range(self.episodes)]

    def read(self, episode_id: str) -> EpisodeData:
        e = int(episode_id[2:])
        n = self.length
        rng = np.random.default_rng([7, e])
        state = rng.normal(size=(n, 7)).cumsum(0).astype(np.float32) * 0.05
        action = np.diff(state, axis=0, append=state[-1:]).astype(np.float32)
        cams = {}
        for k, cam in enumerate(("front", "wrist")):
            clip = self.clips[(e + k) % len(self.clips)]
            cams[cam] = clip_frames(clip, (e * 37 + k * 91) % 120, n, self.size)
        return EpisodeData(id=episode_id, cameras=cams, arrays={"state": state, "action": action}, fps=FPS,
                           prompt="pick up the block", split="train", channel_order="bgr")


def shard_footage(out: Path, *, episodes: int, length: int, size: tuple[int, int],
                  shard_size: int = 4 << 20) -> EpisodeIndex:
    """The footage episodes sharded into ``out`` (JPEG q90, 2 encoder processes); reused when already there."""
    from episodepipes.sharding.write import WriteOptions, write_shards

    if not (out / "index.json").exists():
        shutil.rmtree(out, ignore_errors=True)
        reader = FootageReader(clip_paths(), episodes=episodes, length=length, size=size)
        write_shards(reader, out, WriteOptions(format="footage", shard_size=shard_size, jpeg_quality=90), workers=2)
    return EpisodeIndex.open(out)
