"""Turn one episode into its encoded samples: JPEG per camera, .npy per array, json metadata."""

from __future__ import annotations

import json
from dataclasses import dataclass

import cv2
import numpy as np

from episodepipes.format import npy_bytes, safe_episode_id, safe_field, sample_key, tar_member_parts
from episodepipes.sharding.episode import EpisodeData, EpisodeError


@dataclass(frozen=True, kw_only=True)
class EncodeOptions:
    jpeg_quality: int = 90
    resize: tuple[int, int] | None = None  # (H, W)


@dataclass
class EncodedEpisode:
    meta: dict  # the index entry, without "segments"
    samples: list[list[tuple[str, bytes]]]  # per frame: (member name, bytes), in member order

    def blocks(self) -> list[bytes]:
        """Each frame's tar members as one byte string, ready to append to a shard."""
        return [b"".join(part for name, data in members for part in tar_member_parts(name, data))
                for members in self.samples]


def _jpeg(frame: np.ndarray, opts: EncodeOptions, where: str, *, bgr: bool = False) -> bytes:
    if frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[2] != 3:
        raise EpisodeError(f"{where}: expected HxWx3 uint8 {'BGR' if bgr else 'RGB'}, got {frame.dtype} {frame.shape}")
    if opts.resize is not None:
        h, w = opts.resize
        frame = cv2.resize(frame, (w, h), interpolation=cv2.INTER_AREA)
    ok, buf = cv2.imencode(".jpg", frame if bgr else cv2.cvtColor(frame, cv2.COLOR_RGB2BGR),
                           [cv2.IMWRITE_JPEG_QUALITY, opts.jpeg_quality])
    if not ok:
        raise EpisodeError(f"{where}: JPEG encoding failed")
    return buf.tobytes()


def encode_episode(ep: EpisodeData, opts: EncodeOptions, *, default_split: str = "train") -> EncodedEpisode:
    """Encode every frame; check that cameras and arrays agree on the number of steps."""
    eid = safe_episode_id(ep.id)
    if ep.channel_order not in ("rgb", "bgr"):
        raise EpisodeError(f"episode {ep.id!r}: channel_order={ep.channel_order!r}; the reader must say 'rgb' or 'bgr'")
    bgr = ep.channel_order == "bgr"
    if not ep.cameras:
        raise EpisodeError(f"episode {ep.id!r}: no cameras; every episode needs at least one")
    cams = {safe_field(c): (c, it) for c, it in sorted(ep.cameras.items())}
    per_cam: dict[str, list[bytes]] = {}
    shapes: dict[str, tuple[int, int]] = {}
    for cam, (orig, frames) in cams.items():
        where = f"episode {ep.id!r} camera {orig!r} ({ep.files.get(orig, '?')})"
        out = []
        for i, frame in enumerate(frames):
            out.append(_jpeg(np.asarray(frame), opts, f"{where} frame {i}", bgr=bgr))
            if i == 0:
                shapes[cam] = opts.resize or (int(frame.shape[0]), int(frame.shape[1]))
        per_cam[cam] = out
    lengths = {c: len(v) for c, v in per_cam.items()}
    n = next(iter(lengths.values()))
    if len(set(lengths.values())) != 1:
        raise EpisodeError(f"episode {ep.id!r}: cameras have different frame counts {lengths}; trim them to match")
    if n == 0:
        raise EpisodeError(f"episode {ep.id!r}: empty episode (0 frames); remove it or pass --skip-bad")
    arrays = {safe_field(k): (k, np.asarray(v)) for k, v in sorted(ep.arrays.items())}
    for orig, a in arrays.values():
        if a.ndim == 0 or a.shape[0] != n:
            raise EpisodeError(
                f"episode {ep.id!r}: array {orig!r} has {a.shape[0] if a.ndim else 0} steps but the cameras have "
                f"{n} frames; arrays' first dimension must equal the frame count"
            )
    fps = float(ep.fps)
    samples = []
    for i in range(n):
        key = sample_key(eid, i)
        members = [(f"{key}.{cam}.jpg", per_cam[cam][i]) for cam in per_cam]
        members += [(f"{key}.{k}.npy", npy_bytes(a[i])) for k, (_, a) in arrays.items()]
        info = {"episode": eid, "frame": i, "timestamp": round(i / fps, 9)}
        members.append((f"{key}.json", json.dumps(info, sort_keys=True).encode()))
        samples.append(sorted(members))
    meta = {
        "id": eid,
        "split": ep.split or default_split,
        "length": n,
        "fps": fps,
        "prompt": ep.prompt,
        "cameras": {c: {"height": shapes[c][0], "width": shapes[c][1], "source": ep.sources.get(o, o)}
                    for c, (o, _) in cams.items()},
        "arrays": {k: {"dtype": a.dtype.name,
                       "shape": list(a.shape[1:]), "source": ep.sources.get(o, o)}
                   for k, (o, a) in arrays.items()},
    }
    return EncodedEpisode(meta, samples)
