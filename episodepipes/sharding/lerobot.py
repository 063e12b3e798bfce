"""`LeRobotReader`: a local LeRobot dataset (v3.0, or the v2.x one-file-per-episode layout) as episodes.

v3.0 packs several episodes into one parquet file and one mp4 per camera; ``meta/episodes`` says
which file holds an episode, its parquet rows and its ``[from_timestamp, to_timestamp)`` span in
each mp4. v2.0/v2.1 keep one parquet and one mp4 per episode, which is the same record with
``from_timestamp = 0``, so one reader carries both.

Frames are matched to parquet rows the way LeRobot does it: row ``timestamp + from_timestamp`` takes
the closest decoded frame, and a distance of ``tolerance_s`` or more is an error (LeRobot's default
``tolerance_s`` is 1e-4 s). Only frames inside the episode's span are candidates, so a short episode
never silently borrows its neighbour's frames.
"""

from __future__ import annotations

import itertools
import json
import logging
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from episodepipes.sharding.episode import EpisodeData, EpisodeError, safe_names
from episodepipes.sharding.pool import decode_threads

log = logging.getLogger(__name__)

V3 = "v3.0"
LEGACY = ("v2.0", "v2.1")
INDEX_COLUMNS = frozenset({"timestamp", "frame_index", "episode_index", "index", "task_index"})
DEFAULT_TOLERANCE_S = 1e-4  # LeRobotDataset's default
_ID = re.compile(r"episode_(\d+)")
_EPISODES: dict[tuple, dict[int, _Episode]] = {}  # per process, as workers unpickle a reader per episode


@dataclass(frozen=True)
class _Episode:
    index: int
    length: int
    tasks: tuple[str, ...]
    data_file: str  # relative to the root
    videos: dict[str, tuple[str, float, float | None]]  # key -> (relative mp4, from_ts, to_ts)


class LeRobotReader:
    """`EpisodeReader` over a LeRobot dataset folder (the one holding ``meta/info.json``). Picklable."""

    def __init__(self, root: str | Path, *, tolerance_s: float = DEFAULT_TOLERANCE_S) -> None:
        self.root = Path(root)
        self.tolerance_s = float(tolerance_s)
        info_path = self.root / "meta" / "info.json"
        if not info_path.is_file():
            raise FileNotFoundError(f"{info_path} is missing: pass the LeRobot dataset root (the folder holding "
                                    "meta/, data/ and videos/), or download the dataset's meta/ folder")
        self.info = json.loads(info_path.read_text())
        self.version = str(self.info.get("codebase_version"))
        if self.version not in (V3, *LEGACY):
            raise ValueError(f"{info_path}: codebase_version={self.version!r} is not supported; this reader reads "
                             f"{V3} and {', '.join(LEGACY)}; convert the dataset with LeRobot's converter to {V3}")
        self.fps = float(self.info["fps"])
        feats = self.info.get("features") or {}
        self.video_keys = sorted(k for k, f in feats.items() if f.get("dtype") == "video")
        self.image_keys = sorted(k for k, f in feats.items() if f.get("dtype") == "image")
        self.array_keys = sorted(k for k, f in feats.items() if k not in INDEX_COLUMNS and _numeric(f.get("dtype")))
        self.shapes = {k: tuple(feats[k].get("shape") or ()) for k in self.array_keys}
        self.names = safe_names([*self.video_keys, *self.image_keys, *self.array_keys], info_path)
        skipped = sorted(set(feats) - set(self.names) - INDEX_COLUMNS)
        if skipped:
            log.info("%s: skipping non-numeric features %s", self.root, skipped)
        self.episodes = self._load_episodes()

    def __getstate__(self) -> dict:
        """Only the root travels to encoder processes, not the metadata of every episode."""
        return {"root": self.root, "tolerance_s": self.tolerance_s}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["root"], tolerance_s=state["tolerance_s"])

    def episode_ids(self) -> list[str]:
        return [f"episode_{i:06d}" for i in sorted(self.episodes)]

    def read(self, episode_id: str) -> EpisodeData:
        m = _ID.fullmatch(episode_id)
        if not m or int(m.group(1)) not in self.episodes:
            raise EpisodeError(f"episode {episode_id!r} is not in {self.root}; ids look like 'episode_000003', "
                               "see episode_ids()")
        ep = self.episodes[int(m.group(1))]
        table = self._rows(episode_id, ep)
        n = table.num_rows
        if n != ep.length:
            raise EpisodeError(f"episode {episode_id!r}: {self.root / ep.data_file} holds {n} rows, meta/episodes "
                               f"says length={ep.length}; the dataset is inconsistent, re-download or re-convert it")
        times = table.column("timestamp").to_numpy().astype(np.float64)
        cameras: dict[str, Iterable[np.ndarray]] = {}
        files: dict[str, str] = {}
        for key in self.video_keys:
            rel, start, end = ep.videos[key]
            where = f"episode {episode_id!r} camera {key!r} ({self.root / rel})"
            if end is not None and n and start + times.max() >= end - 0.5 / self.fps:
                raise EpisodeError(f"{where}: the last row's timestamp {times.max():.6f}s lies past the episode's "
                                   f"video span [{start:.6f}s, {end:.6f}s) from meta/episodes; fix its "
                                   "to_timestamp or the rows")
            cameras[self.names[key]] = _video_frames(self.root / rel, start, end, times, self.fps,
                                                     self.tolerance_s, where)
            files[self.names[key]] = str(self.root / rel)
        for key in self.image_keys:
            where = f"episode {episode_id!r} image feature {key!r} ({self.root / ep.data_file})"
            cameras[self.names[key]] = _image_frames(table.column(key).to_pylist(), self.root, where)
            files[self.names[key]] = str(self.root / ep.data_file)
        arrays = {self.names[k]: _column(table.column(k), self.shapes[k], f"episode {episode_id!r} feature {k!r}")
                  for k in self.array_keys}
        tasks = ep.tasks or self._tasks_of(table)
        return EpisodeData(id=episode_id, cameras=cameras, arrays=arrays, fps=self.fps, prompt="; ".join(tasks),
                           sources={v: k for k, v in self.names.items()}, files=files)

    def _rows(self, episode_id: str, ep: _Episode):  # noqa: ANN202 (pyarrow.Table, imported lazily)
        import pyarrow.parquet as pq

        path = self.root / ep.data_file
        if not path.is_file():
            raise EpisodeError(f"episode {episode_id!r}: parquet {path} is missing; re-download the dataset's data/")
        cols = ["timestamp", "frame_index", "episode_index", "task_index", *self.image_keys, *self.array_keys]
        have = set(pq.read_schema(path).names)
        missing = [c for c in cols if c not in have and c != "task_index"]
        if missing:
            raise EpisodeError(f"episode {episode_id!r}: {path} has no columns {missing}, which meta/info.json "
                               "lists as features; the dataset is inconsistent, re-convert it")
        table = pq.read_table(path, columns=[c for c in cols if c in have],
                              filters=[("episode_index", "=", ep.index)])
        return table.sort_by("frame_index")

    def _load_episodes(self) -> dict[int, _Episode]:
        """Episode metadata, loaded once per process for as long as its files do not change."""
        if self.version == V3:
            files = sorted((self.root / "meta" / "episodes").glob("chunk-*/file-*.parquet"))
        else:
            files = [p for p in [self.root / "meta" / "episodes.jsonl"] if p.is_file()]
        if not files:
            raise FileNotFoundError(f"{self.root / 'meta'} has no {self.version} episode metadata (meta/episodes/"
                                    "chunk-*/file-*.parquet, or meta/episodes.jsonl before v3.0); re-download meta/")
        stamp = tuple((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in [self.root / "meta/info.json", *files])
        key = (str(self.root.resolve()), stamp, tuple(self.video_keys))
        if key not in _EPISODES:
            if len(_EPISODES) >= 4:
                _EPISODES.clear()
            eps = self._v3_episodes(files) if self.version == V3 else self._legacy_episodes(files[0])
            _EPISODES[key] = {e.index: e for e in eps}
        return _EPISODES[key]

    def _v3_episodes(self, files: list[Path]) -> list[_Episode]:
        import pyarrow.parquet as pq

        vcols = [f"videos/{k}/{c}" for k in self.video_keys
                 for c in ("chunk_index", "file_index", "from_timestamp", "to_timestamp")]
        cols = ["episode_index", "length", "tasks", "data/chunk_index", "data/file_index", *vcols]
        out = []
        for f in files:
            missing = [c for c in cols if c not in pq.read_schema(f).names]
            if missing:
                raise ValueError(f"{f}: episode metadata has no columns {missing}; is it a {V3} dataset? re-convert it")
            for r in pq.read_table(f, columns=cols).to_pylist():
                data = self.info["data_path"].format(chunk_index=r["data/chunk_index"],
                                                     file_index=r["data/file_index"])
                videos = {k: (self.info["video_path"].format(video_key=k, chunk_index=r[f"videos/{k}/chunk_index"],
                                                             file_index=r[f"videos/{k}/file_index"]),
                              float(r[f"videos/{k}/from_timestamp"]), float(r[f"videos/{k}/to_timestamp"]))
                          for k in self.video_keys}
                out.append(_Episode(int(r["episode_index"]), int(r["length"]), tuple(r["tasks"] or ()), data, videos))
        return out

    def _legacy_episodes(self, path: Path) -> list[_Episode]:
        size = int(self.info.get("chunks_size", 1000))
        out = []
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            r = json.loads(line)
            i = int(r["episode_index"])
            data = self.info["data_path"].format(episode_chunk=i // size, episode_index=i)
            videos = {k: (self.info["video_path"].format(episode_chunk=i // size, video_key=k, episode_index=i),
                          0.0, None) for k in self.video_keys}
            out.append(_Episode(i, int(r["length"]), tuple(r.get("tasks") or ()), data, videos))
        return out

    def _tasks_of(self, table) -> tuple[str, ...]:  # noqa: ANN001 (pyarrow.Table)
        """Tasks from the per-row task_index, for metadata without a ``tasks`` entry."""
        if "task_index" not in table.column_names:
            return ()
        if self.version == V3:
            import pyarrow.parquet as pq

            t = pq.read_table(self.root / "meta" / "tasks.parquet")
            name = next(c for c in ("task", "__index_level_0__", t.column_names[-1]) if c in t.column_names)
            names = dict(zip(t.column("task_index").to_pylist(), t.column(name).to_pylist()))
        else:
            rows = [json.loads(x) for x in (self.root / "meta" / "tasks.jsonl").read_text().splitlines() if x.strip()]
            names = {r["task_index"]: r["task"] for r in rows}
        return tuple(names[i] for i in dict.fromkeys(table.column("task_index").to_pylist()))


def _numeric(dtype: object) -> bool:
    try:
        return np.dtype(str(dtype)).kind in "biuf"
    except TypeError:
        return False


def _column(col, shape: tuple[int, ...], where: str) -> np.ndarray:  # noqa: ANN001 (pyarrow.ChunkedArray)
    """A parquet column (scalars, or nested lists) as one (n, *shape) array, without a Python loop."""
    import pyarrow as pa

    arr, n, nested = col.combine_chunks(), len(col), False
    while pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type) or pa.types.is_fixed_size_list(arr.type):
        if arr.null_count:
            raise EpisodeError(f"{where}: {arr.null_count} null values; fill or drop those rows")
        arr, nested = arr.flatten(), True
    if arr.null_count:
        raise EpisodeError(f"{where}: {arr.null_count} null values; fill or drop those rows")
    values = arr.to_numpy(zero_copy_only=False)
    if not nested:
        return values
    size = int(np.prod(shape)) if shape else 0
    return values.reshape(n, *shape) if size and values.size == n * size else values.reshape(n, -1)


def _image_frames(cells: list[dict | None], root: Path, where: str) -> Iterator[np.ndarray]:
    """Decode parquet image cells ({bytes, path}) to RGB, one at a time."""
    for i, cell in enumerate(cells):
        data = (cell or {}).get("bytes")
        if data is None and (cell or {}).get("path"):
            p = Path(cell["path"])
            data = (p if p.is_absolute() else root / p).read_bytes()
        img = None if data is None else cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
        if img is None:
            raise EpisodeError(f"{where} row {i}: no decodable image bytes; re-export the dataset with images embedded")
        yield cv2.cvtColor(img, cv2.COLOR_BGR2RGB)


def _video_frames(path: Path, start: float, end: float | None, times: np.ndarray, fps: float, tol: float,
                  where: str) -> Iterator[np.ndarray]:
    """Decode ``path`` from ``start`` and yield, per row time, the closest frame of the episode's span."""
    import av

    if not path.is_file():
        raise EpisodeError(f"{where}: video file is missing; re-download the dataset's videos/")
    half = 0.5 / fps  # span edges sit half a frame out, so rounding never drops an edge frame
    try:
        with av.open(str(path)) as container:
            decoded = itertools.dropwhile(lambda tf: tf[0] < start - half, _decode_from(container, start, half))
            if end is not None:  # frames past the span belong to the next episode in the file
                decoded = itertools.takewhile(lambda tf: tf[0] < end - half, decoded)  # stop decoding there
            yield from _match(decoded, start + times, start, tol, where)
    except (av.FFmpegError, OSError, IndexError) as e:
        raise EpisodeError(f"{where}: cannot decode the video ({type(e).__name__}: {e}); re-download or "
                           "re-encode it") from e


def _decode_from(container, start: float, half: float) -> Iterator[tuple[float, object]]:  # noqa: ANN001
    """(time, frame) pairs from a keyframe at or before ``start``.

    An open-GOP keyframe (hevc CRA) can sit before the seek target in decode order yet show after it,
    so when the first frame comes too late, seek further back, down to the file start if need be.
    """
    stream = container.streams.video[0]
    stream.thread_type, stream.thread_count = "AUTO", decode_threads()
    back = 0.0
    while True:
        target = max(start - back, 0.0)
        if target > 0 or back:
            container.seek(int(target / stream.time_base), stream=stream, backward=True)
        frames = ((f.time, f) for f in container.decode(stream) if f.time is not None)
        first = next(frames, None)
        if first is None or first[0] <= start + half or target == 0.0:
            yield from ([first] if first else [])
            yield from frames
            return
        log.debug("seek to %.3fs started decoding at %.3fs; seeking further back", target, first[0])
        back = max(2 * back, 1.0)


def _match(frames: Iterable[tuple[float, object]], queries: np.ndarray, start: float, tol: float,
           where: str) -> Iterator[np.ndarray]:
    """LeRobot's rule on a stream: each query takes its closest frame, within ``tol``; frames are pts-ordered."""
    it = iter(frames)
    prev, cur = None, next(it, None)
    for i, q in enumerate(queries):
        while cur is not None and cur[0] <= q:
            prev, cur = cur, next(it, None)
        best = min((c for c in (prev, cur) if c is not None), key=lambda c: abs(c[0] - q), default=None)
        if best is None or abs(best[0] - q) >= tol:
            near = "no frame at all" if best is None else f"the closest frame is at {best[0]:.6f}s"
            raise EpisodeError(
                f"{where}: row {i} (timestamp {q - start:.6f}s, {q:.6f}s in the file) has no frame within "
                f"tolerance_s={tol}; {near}. The video is shorter than the episode or out of sync: re-encode it, "
                "or pass a larger tolerance_s if the timestamps jitter")
        yield best[1].to_ndarray(format="rgb24")
