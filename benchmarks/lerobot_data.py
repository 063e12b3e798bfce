"""Build a small LeRobot-format dataset (v3.0 or v2.1) from the public spec, without lerobot installed.

Content comes from `SyntheticReader` (textured scenes, smooth state/action arrays). Videos are
encoded with PyAV; in v3.0 several episodes share one mp4 per camera, one after another, as
LeRobot's writer lays them out. Used by tests/sharding/test_lerobot.py and benchmarks/bench_lerobot.py.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import av
import cv2
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from episodepipes.codec.encode import same_scheduling
from episodepipes.sharding.formats.synthetic import SyntheticReader

T = TypeVar("T")

V3_DATA = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
V3_VIDEO = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
V2_DATA = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"
V2_VIDEO = "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"
VIDEO_KEYS = ("observation.images.front", "observation.images.wrist")
IMAGE_KEY = "observation.images.gripper"
# encoder -> (the codec name info.json records, options); LeRobot's default is libsvtav1, g=2, crf=30
ENCODERS = {"libsvtav1": ("av1", {"crf": "30", "preset": "12"}),
            "libaom-av1": ("av1", {"crf": "30", "cpu-used": "8"}),
            "libx264": ("h264", {"crf": "18", "preset": "ultrafast"}),
            "h264": ("h264", {"crf": "18", "preset": "ultrafast"}),
            "libx265": ("hevc", {"crf": "20", "preset": "ultrafast", "x265-params": "log-level=error"}),
            "libvpx-vp9": ("vp9", {"crf": "20", "b": "0", "deadline": "realtime", "cpu-used": "8"})}
FAMILIES = {"av1": ("libsvtav1", "libaom-av1"), "h264": ("libx264", "h264"), "hevc": ("libx265",),
            "vp9": ("libvpx-vp9",)}


def available_encoders(families: tuple[str, ...] = ("av1", "h264")) -> list[str]:
    """One encoder per codec family (LeRobot's AV1 first), where this PyAV build has one."""
    have = av.codecs_available
    return [e for f in families for e in [next((e for e in FAMILIES[f] if e in have), None)] if e]


@dataclass
class SourceEpisode:
    """The ground truth of one written episode, for checking what a reader gives back."""

    index: int
    task: str
    frames: dict[str, np.ndarray]  # LeRobot key -> (n, H, W, 3) uint8 RGB, as fed to the encoder
    arrays: dict[str, np.ndarray]  # LeRobot key -> (n, ...) as written to parquet


def restores_scheduling(fn: Callable[..., T]) -> Callable[..., T]:
    """Run ``fn`` inside `same_scheduling`: building AV1 videos must not leave the caller real-time."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        with same_scheduling():
            return fn(*args, **kwargs)

    return wrapper


@restores_scheduling
def make_lerobot(root: Path, *, num_episodes: int = 3, length: int = 15, lengths: tuple[int, ...] | None = None,
                 height: int = 64, width: int = 96, fps: int = 10, encoder: str | None = None,
                 version: str = "v3.0", episodes_per_file: int = 2, image_feature: bool = True,
                 gop: int = 2, short_video: int = 0, seed: int = 0) -> list[SourceEpisode]:
    """Write a LeRobot dataset into ``root``; ``short_video`` drops that many frames from each video's end.

    ``gop=2`` is LeRobot's keyframe interval; a long one puts episode starts mid-GOP, to test seeking.
    """
    encoder = encoder or available_encoders()[0]
    synth = SyntheticReader(num_episodes=num_episodes, length=length, lengths=lengths, height=height, width=width,
                            cameras=(*VIDEO_KEYS, IMAGE_KEY) if image_feature else VIDEO_KEYS, fps=fps, seed=seed)
    eps = []
    for i, eid in enumerate(synth.episode_ids()):
        d = synth.read(eid)
        n = len(d.arrays["state"])
        arrays = {"observation.state": d.arrays["state"], "action": d.arrays["action"],
                  "next.reward": np.linspace(0, 1, n, dtype=np.float32), "next.done": np.arange(n) == n - 1}
        eps.append(SourceEpisode(i, d.prompt, {k: np.stack(list(v)) for k, v in d.cameras.items()}, arrays))
    tasks = sorted({e.task for e in eps})
    per_file = episodes_per_file if version == "v3.0" else 1
    groups = [eps[i:i + per_file] for i in range(0, len(eps), per_file)]
    meta_rows, index = [], 0
    for f, group in enumerate(groups):
        names = {"chunk_index": 0, "file_index": f} if version == "v3.0" else \
            {"episode_chunk": 0, "episode_index": group[0].index}
        spans = {k: _write_video(root / (V3_VIDEO if version == "v3.0" else V2_VIDEO).format(video_key=k, **names),
                                 [e.frames[k] for e in group], fps, encoder, gop, short_video) for k in VIDEO_KEYS}
        rows = []
        for j, e in enumerate(group):
            n = len(e.arrays["action"])
            rows.append(_rows(e, index, tasks.index(e.task), fps, image_feature))
            meta = {"episode_index": e.index, "tasks": [e.task], "length": n, "data/chunk_index": 0,
                    "data/file_index": f, "dataset_from_index": index, "dataset_to_index": index + n,
                    "meta/episodes/chunk_index": 0, "meta/episodes/file_index": 0,
                    "stats/action/mean": e.arrays["action"].mean(0).tolist()}
            for k in VIDEO_KEYS:
                meta |= {f"videos/{k}/chunk_index": 0, f"videos/{k}/file_index": f,
                         f"videos/{k}/from_timestamp": spans[k][j][0], f"videos/{k}/to_timestamp": spans[k][j][1]}
            meta_rows.append(meta)
            index += n
        path = root / (V3_DATA if version == "v3.0" else V2_DATA).format(**names)
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.concat_tables(rows), path)
    _write_meta(root, version, eps, tasks, meta_rows, fps, height, width, ENCODERS[encoder][0], image_feature)
    return eps


def _rows(e: SourceEpisode, first: int, task_index: int, fps: int, image_feature: bool) -> pa.Table:
    n = len(e.arrays["action"])
    state = e.arrays["observation.state"]
    cols = {"observation.state": pa.FixedSizeListArray.from_arrays(pa.array(state.ravel()), state.shape[1]),
            "action": pa.array(list(e.arrays["action"])),  # variable-size lists, as HF Sequence writes them
            "next.reward": pa.array(e.arrays["next.reward"]), "next.done": pa.array(e.arrays["next.done"]),
            "timestamp": pa.array(np.arange(n, dtype=np.float32) / np.float32(fps)),
            "frame_index": pa.array(np.arange(n)), "episode_index": pa.array(np.full(n, e.index)),
            "index": pa.array(np.arange(first, first + n)), "task_index": pa.array(np.full(n, task_index))}
    if image_feature:
        png = [cv2.imencode(".png", cv2.cvtColor(f, cv2.COLOR_RGB2BGR))[1].tobytes() for f in e.frames[IMAGE_KEY]]
        cols[IMAGE_KEY] = pa.array([{"bytes": b, "path": f"frame_{i:06d}.png"} for i, b in enumerate(png)],
                                   pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
    return pa.table(cols)


def _write_video(path: Path, episodes: list[np.ndarray], fps: int, encoder: str, gop: int,
                 short: int) -> list[tuple[float, float]]:
    """Encode episodes back to back into one mp4; returns each one's (from, to) timestamps."""
    path.parent.mkdir(parents=True, exist_ok=True)
    frames = np.concatenate(episodes)
    frames = frames[:len(frames) - short]
    with av.open(str(path), "w") as out:
        stream = out.add_stream(encoder, rate=fps, options={"g": str(gop), **ENCODERS[encoder][1]})
        stream.width, stream.height, stream.pix_fmt = frames.shape[2], frames.shape[1], "yuv420p"
        for i, a in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(a, format="rgb24")
            frame.pts = i
            out.mux(stream.encode(frame))
        out.mux(stream.encode())
    bounds = np.cumsum([0] + [len(e) for e in episodes]) / fps
    return [(float(a), float(b)) for a, b in zip(bounds[:-1], bounds[1:])]


def _write_meta(root: Path, version: str, eps: list[SourceEpisode], tasks: list[str], meta_rows: list[dict],
                fps: int, height: int, width: int, codec: str, image_feature: bool) -> None:
    (root / "meta").mkdir(parents=True, exist_ok=True)
    video = {"dtype": "video", "shape": [height, width, 3], "names": ["height", "width", "channels"],
             "info": {"video.fps": fps, "video.height": height, "video.width": width, "video.codec": codec,
                      "video.pix_fmt": "yuv420p", "has_audio": False}}
    first = eps[0].arrays
    features = {k: dict(video) for k in VIDEO_KEYS}
    if image_feature:
        features[IMAGE_KEY] = {"dtype": "image", "shape": [height, width, 3], "names": ["height", "width", "channel"]}
    for k in ("observation.state", "action"):
        features[k] = {"dtype": "float32", "shape": list(first[k].shape[1:]), "names": None}
    features |= {"next.reward": {"dtype": "float32", "shape": [1], "names": None},
                 "next.done": {"dtype": "bool", "shape": [1], "names": None},
                 "timestamp": {"dtype": "float32", "shape": [1], "names": None},
                 **{k: {"dtype": "int64", "shape": [1], "names": None}
                    for k in ("frame_index", "episode_index", "index", "task_index")}}
    total = sum(len(e.arrays["action"]) for e in eps)
    info = {"codebase_version": version, "robot_type": "synthetic", "total_episodes": len(eps), "total_frames": total,
            "total_tasks": len(tasks), "chunks_size": 1000, "fps": fps, "splits": {"train": f"0:{len(eps)}"},
            "data_path": V3_DATA if version == "v3.0" else V2_DATA,
            "video_path": V3_VIDEO if version == "v3.0" else V2_VIDEO, "features": features}
    (root / "meta" / "info.json").write_text(json.dumps(info, indent=4))
    if version == "v3.0":
        meta = root / "meta"
        (meta / "episodes" / "chunk-000").mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(meta_rows), meta / "episodes" / "chunk-000" / "file-000.parquet")
        pq.write_table(pa.table({"task_index": list(range(len(tasks))), "task": tasks}), meta / "tasks.parquet")
    else:
        lines = [json.dumps({"episode_index": r["episode_index"], "tasks": r["tasks"], "length": r["length"]})
                 for r in meta_rows]
        (root / "meta" / "episodes.jsonl").write_text("\n".join(lines) + "\n")
        (root / "meta" / "tasks.jsonl").write_text(
            "\n".join(json.dumps({"task_index": i, "task": t}) for i, t in enumerate(tasks)) + "\n")
