"""``write --format raw --codec reference``: raw episode folders indexed in place (`reference_build`), as ``--codec
copy`` would shard them: a ``<camera>.mp4`` camera by every packet of its file, frame t being packet t (the file must
start at a keyframe), an image folder by its files, one a frame (`reference_images`); the arrays from ``arrays.npz``
and the metadata from ``meta.json``."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from episodepipes.codec.copy import MAX_GOP
from episodepipes.format import safe_episode_id, safe_field
from episodepipes.sharding.episode import EpisodeError
from episodepipes.sharding.formats.lerobot_ref import ReferenceResult
from episodepipes.sharding.formats.raw import ImageFrames, RawReader, VideoFrames
from episodepipes.sharding.formats.reference_build import SHARD_SIZE, Builder, Camera, check_out
from episodepipes.sharding.formats.reference_images import raw_camera
from episodepipes.sharding.write.plan import assign_splits


def index_raw(src: str | os.PathLike, out: str | os.PathLike, *, shard_size: int = SHARD_SIZE,
              val_fraction: float | None = None, val_episodes: tuple[str, ...] | None = None, seed: int = 0,
              overwrite: bool = False) -> ReferenceResult:
    """Index the raw folder ``src`` in place into ``out`` (arguments as `lerobot_ref.index_lerobot`'s). A camera
    that is an image folder points at its files (`reference_images.raw_camera`)."""
    t0 = time.perf_counter()
    reader = RawReader(Path(src))
    root, out = Path(src), Path(out)
    check_out(out, overwrite)
    ids = reader.episode_ids()
    splits = assign_splits(ids, val_fraction=val_fraction, val_episodes=val_episodes, seed=seed)
    build = Builder(root, shard_size)
    try:
        real = root.resolve()
        for eid in ids:
            ep = reader.read(eid)
            where = f"episode {eid!r}"
            arrays = {safe_field(k): (ep.sources.get(k, k), np.asarray(v)) for k, v in ep.arrays.items()}
            cams, rels = [], []
            for cam, frames in sorted(ep.cameras.items()):
                if not isinstance(frames, VideoFrames):
                    cams.append(_image_camera(build, cam, ep.sources.get(cam, cam), frames, f"{where} camera {cam!r}"))
                    continue
                rel = Path(frames.path).resolve().relative_to(real).as_posix()
                cw = f"{where} camera {cam!r} ({frames.path})"
                v = build.video(rel, cw)
                rels.append(rel)
                if v.key_of[0] != 0:
                    raise EpisodeError(f"{cw}: the file does not start at a keyframe; re-encode it with --codec av1")
                gop = int((np.arange(len(v.key_of)) - v.key_of).max()) + 1
                if gop > MAX_GOP:
                    raise EpisodeError(f"{cw}: its keyframes are up to {gop} frames apart, more than {MAX_GOP}; "
                                       "re-encode it with --codec av1 (short GOPs)")
                cams.append(Camera(safe_field(cam), ep.sources.get(cam, cam), v, 0, len(v.times), 0))
            n = cams[0].count
            build.add(safe_episode_id(ep.id), n, cams, arrays, fps=float(ep.fps), prompt=ep.prompt,
                      split=splits[eid] or ep.split or "train", extra=dict(ep.extra))
            for rel in rels:
                build.drop(rel)
        shards, frames, written = build.finish(out, {
            "format": "raw", "codec": "reference", "shard_size": shard_size,
            **({"val_fraction": val_fraction} if val_fraction is not None else {}), "seed": seed})
    finally:
        build.close()
    return ReferenceResult(out, len(ids), frames, shards, time.perf_counter() - t0, build.source_bytes, written)


def _image_camera(build: Builder, cam: str, source: str, frames: ImageFrames, where: str) -> Camera:
    """An image folder's camera: each frame points at its file."""
    if not isinstance(frames, ImageFrames):
        raise EpisodeError(f"{where}: a camera of {type(frames).__name__}, neither a video nor an image folder")
    images = raw_camera(build.images, build.real, frames.files, where)
    return Camera(safe_field(cam), source, images, 0, len(images.offsets), 0)
