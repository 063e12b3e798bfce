"""`LeRobotReader`: a local LeRobot dataset (v3.0, or the v2.x one-file-per-episode layout) as episodes.

v3.0 packs several episodes into one parquet file and one mp4 per camera; ``meta/episodes`` says
which file holds an episode, its parquet rows and its ``[from_timestamp, to_timestamp)`` span in
each mp4. v2.0/v2.1 keep one parquet and one mp4 per episode, which is the same record with
``from_timestamp = 0``, so one reader carries both.

Frames are matched to parquet rows the way LeRobot does it: row ``timestamp + from_timestamp`` takes
the closest decoded frame, and a distance of ``tolerance_s`` or more is an error (LeRobot's default
``tolerance_s`` is 1e-4 s). Only frames inside the episode's span are candidates, so a short episode
never silently borrows its neighbour's frames.

With ``copy=True`` (``write --codec copy``) a video camera's packets are copied out of its mp4 instead
(`episodepipes.codec.copy_packets`), and nothing is decoded. The same rule is checked on the packets'
timestamps, demuxed only: each row must take the next frame of the span, one packet per row, else the
episode is refused with the fix (re-encode). Image features (PNG/JPEG in the parquet) have no packets to
copy: they stay frames, which the shard writer stores as JPEG.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import cv2
import numpy as np

from episodepipes.codec.copy import VideoSource
from episodepipes.codec.stream import DEMUXERS, Packets
from episodepipes.sharding.episode import EpisodeData, EpisodeError, safe_names
from episodepipes.sharding.formats import lerobot_meta as meta
from episodepipes.sharding.formats.imagehead import check_header, read_image
from episodepipes.sharding.formats.lerobot_meta import LEGACY as LEGACY  # re-exported
from episodepipes.sharding.formats.lerobot_meta import V3, Episode
from episodepipes.sharding.write.encoders import decode_threads

log = logging.getLogger(__name__)

INDEX_COLUMNS = frozenset({"timestamp", "frame_index", "episode_index", "index", "task_index"})
DEFAULT_TOLERANCE_S = 1e-4  # LeRobotDataset's default
TOLERANCE_HINT = "or pass a larger tolerance_s (`--tolerance-s` of `episodepipes-shard write`) if the timestamps jitter"
# the demuxer comes from the template's suffix, never from probing a file's bytes (an mp4 holding an
# HLS playlist would otherwise be read as one, and open the files it lists)
VIDEO_SUFFIXES = (".mp4", ".m4v", ".mov", ".mkv", ".webm")  # what LeRobot writes; the demuxer is codec's (DEMUXERS)
_ID = re.compile(r"episode_([0-9]+)")
_EPISODES: dict[tuple, dict[int, Episode]] = {}  # per process, as workers unpickle a reader per episode


class LeRobotReader:
    """`EpisodeReader` over a LeRobot dataset folder (the one holding ``meta/info.json``). Picklable.

    Its metadata is hostile input (see `episodepipes.sharding.formats.lerobot_meta`): no file outside ``root``
    is ever opened, and ``tolerance_s`` must be a finite number of seconds > 0. ``copy``: give each video
    camera as `EpisodeData.packets` copied from its mp4, never decoded (``write --codec copy``); image features stay
    frames.

    Copying keeps each camera's mp4 open (`VideoSource`) from one episode to the next and closes it after the last
    episode that uses it, so reading the episodes of a v3 file in order opens and demuxes it once; ``video_counts``
    tallies the files "opened" and packets "demuxed". `close` closes what is still open.
    """

    def __init__(self, root: str | Path, *, tolerance_s: float = DEFAULT_TOLERANCE_S, copy: bool = False) -> None:
        if not isinstance(copy, bool):
            raise ValueError(f"{copy=} should be True or False")
        self.root = Path(root)
        self.tolerance_s = meta.tolerance(tolerance_s)
        self.copy = copy
        self._real = self.root.resolve()
        info_path = self.root / "meta" / "info.json"
        if not os.path.lexists(info_path):
            raise FileNotFoundError(f"{info_path} is missing: pass the LeRobot dataset root (the folder holding "
                                    "meta/, data/ and videos/), or download the dataset's meta/ folder")
        where = str(info_path)
        self.info = meta.read_json(self._file("meta/info.json", where, ValueError), info_path)
        self.version, self.fps, feats = meta.check_info(self.info, where)
        robot = self.info.get("robot_type")
        if robot is not None and not isinstance(robot, str):
            raise ValueError(f"{where}: robot_type={str(robot)[:60]!r} must be a string or null; fix meta/info.json")
        self.extra = {} if robot is None else {"robot_type": robot}  # every episode's attributes in the index
        self.video_keys = sorted(k for k, f in feats.items() if f["dtype"] == "video")
        self.image_keys = sorted(k for k, f in feats.items() if f["dtype"] == "image")
        self.array_keys = sorted(k for k, f in feats.items() if k not in INDEX_COLUMNS and _numeric(f["dtype"]))
        self.shapes = {k: tuple(feats[k].get("shape") or ()) for k in self.array_keys}
        self.names = safe_names([*self.video_keys, *self.image_keys, *self.array_keys], info_path)
        self.data_path = meta.template(self.info, "data_path", self.version, where)
        self.video_path = meta.template(self.info, "video_path", self.version, where) if self.video_keys else ""
        self.chunks_size = 1000 if self.version == V3 else meta.index(self.info.get("chunks_size", 1000),
                                                                      "chunks_size", where, low=1)
        skipped = sorted(set(feats) - set(self.names) - INDEX_COLUMNS)
        if skipped:
            log.info("%s: skipping non-numeric features %s", self.root, skipped)
        self.episodes = self._load_episodes()
        meta.check_total(self.info, len(self.episodes), where)
        self._last_use: dict[str, int] = {}  # video file -> the last episode (by index) that shows it
        for i, ep in sorted(self.episodes.items()):
            for rel, _, _ in ep.videos.values():
                self._last_use[rel] = i
        self._last_data = {ep.data_file: i for i, ep in sorted(self.episodes.items())}
        self._data = None  # (path, table) of the parquet file the last episode read came from, all its rows
        self.data_reads = 0
        self._videos: dict[str, VideoSource] = {}  # camera -> the file its last copied episode came from, open
        self._lock = threading.Lock()  # over `_videos`: a source is one demux position
        self.video_counts: Counter = Counter()

    def __getstate__(self) -> dict:
        """Only the root travels to encoder processes, not the metadata of every episode."""
        return {"root": self.root, "tolerance_s": self.tolerance_s, "copy": self.copy}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["root"], tolerance_s=state["tolerance_s"], copy=state["copy"])

    def close(self) -> None:
        """Close the video files copying keeps open (a later read opens them again)."""
        with self._lock:
            for key in list(self._videos):
                self._videos.pop(key).close()

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
        shown = self.root / ep.data_file
        if n != ep.length:
            raise EpisodeError(f"episode {episode_id!r}: {shown} holds {n} rows, meta/episodes "
                               f"says length={ep.length}; the dataset is inconsistent, re-download or re-convert it")
        _check_frame_index(table.column("frame_index"), f"episode {episode_id!r}: {shown}")
        times = _timestamps(table.column("timestamp"), f"episode {episode_id!r}: {shown}")
        cameras: dict[str, Iterable[np.ndarray]] = {}
        packets: dict[str, Packets] = {}
        files: dict[str, str] = {}
        for key in self.video_keys:
            rel, start, end = ep.videos[key]
            where = f"episode {episode_id!r} camera {key!r} ({self.root / rel})"
            if end is not None and n and start + times.max() >= end - 0.5 / self.fps:
                raise EpisodeError(f"{where}: the last row's timestamp {times.max():.6f}s lies past the episode's "
                                   f"video span [{start:.6f}s, {end:.6f}s) from meta/episodes; fix its "
                                   "to_timestamp or the rows")
            path = self._file(rel, f"episode {episode_id!r} camera {key!r} video_path", EpisodeError)
            if self.copy:
                _demuxer(path, where)
                with self._lock:
                    try:
                        packets[self.names[key]] = _copied(lambda k=key, p=path: self._video(k, p), start, end,
                                                           times, self.fps, self.tolerance_s, where)
                    finally:  # after the file's last episode, or an error (the demux position is unknown then)
                        if key in self._videos and (self._last_use[rel] <= ep.index or self.names[key] not in packets):
                            self._videos.pop(key).close()
            else:
                cameras[self.names[key]] = _video_frames(path, start, end, times, self.fps, self.tolerance_s, where)
            files[self.names[key]] = str(self.root / rel)
        for key in self.image_keys:
            where = f"episode {episode_id!r} image feature {key!r} ({shown})"
            cameras[self.names[key]] = _image_frames(table.column(key), self._real, where)
            files[self.names[key]] = str(shown)
        arrays = {self.names[k]: _column(table.column(k), self.shapes[k], f"episode {episode_id!r} feature {k!r}")
                  for k in self.array_keys}
        tasks = ep.tasks or self._tasks_of(table, episode_id)
        return EpisodeData(id=episode_id, cameras=cameras, arrays=arrays, fps=self.fps, prompt="; ".join(tasks),
                           sources={v: k for k, v in self.names.items()}, files=files, extra=dict(self.extra),
                           packets=packets)

    def _video(self, key: str, path: Path) -> VideoSource:
        """Camera ``key``'s open file if it is ``path``, else ``path`` opened in its place."""
        src = self._videos.get(key)
        if src is None or src.path != path:
            if src is not None:
                self._videos.pop(key).close()
            src = self._videos[key] = VideoSource(path, counts=self.video_counts)
        return src

    def _file(self, rel: str, what: str, error: type[ValueError]) -> Path:
        """The resolved path of ``rel`` under the root; refused unless it is inside it (symlinks too)."""
        return meta.regular_file(meta.inside(self._real, rel, what, error), what, error)

    def _rows(self, episode_id: str, ep: Episode):  # noqa: ANN202 (pyarrow.Table, imported lazily)
        """The episode's rows, sorted by frame_index. Its parquet file is read once for all the episodes it holds
        (kept until its last one), not once per episode (``data_reads`` counts the reads)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        shown = self.root / ep.data_file
        path = self._file(ep.data_file, f"episode {episode_id!r} data_path", EpisodeError)
        if not path.is_file():
            raise EpisodeError(f"episode {episode_id!r}: parquet {shown} is missing; re-download the dataset's data/")
        where = f"episode {episode_id!r}: {shown}"
        with self._lock:
            held = self._data
            if held is None or held[0] != path:
                cols = ["timestamp", "frame_index", "episode_index", "task_index", *self.image_keys,
                        *self.array_keys]
                have = set(_parquet(path, where, EpisodeError, schema=True).names)
                missing = [c for c in cols if c not in have and c != "task_index"]
                if missing:
                    raise EpisodeError(f"{where} has no columns {missing}, which meta/info.json lists as features; "
                                       "the dataset is inconsistent, re-convert it")
                held = self._data = (path, _parquet(path, where, EpisodeError, columns=[c for c in cols if c in have]))
                self.data_reads += 1
            if self._last_data[ep.data_file] <= ep.index:
                self._data = None
        table = held[1]
        try:
            table = table.filter(pc.equal(table.column("episode_index"), pa.scalar(ep.index, pa.int64())))
        except (pa.ArrowException, TypeError, ValueError) as e:
            raise EpisodeError(f"{where}: cannot select the episode's rows by episode_index ({type(e).__name__}: "
                               f"{e}); re-convert the dataset") from None
        return table.sort_by("frame_index")

    def _meta_files(self) -> list[Path]:
        """The episode metadata files, each checked to resolve inside the root, folder by folder."""
        if self.version != V3:
            rel = "meta/episodes.jsonl"
            return [self._file(rel, str(self.root / rel), ValueError)] if os.path.lexists(self.root / rel) else []
        if not os.path.lexists(self.root / "meta/episodes"):
            return []
        files = []
        for chunk in sorted(meta.inside(self._real, "meta/episodes", "meta/episodes").glob("chunk-*")):
            rel = f"meta/episodes/{chunk.name}"
            for f in sorted(meta.inside(self._real, rel, str(self.root / rel)).glob("file-*.parquet")):
                files.append(self._file(f"{rel}/{f.name}", str(self.root / rel / f.name), ValueError))
        return files

    def _load_episodes(self) -> dict[int, Episode]:
        """Episode metadata, loaded once per process for as long as its files do not change."""
        files = self._meta_files()
        if not files:
            raise FileNotFoundError(f"{self.root / 'meta'} has no {self.version} episode metadata (meta/episodes/"
                                    "chunk-*/file-*.parquet, or meta/episodes.jsonl before v3.0); re-download meta/")
        stamp = tuple((str(p), p.stat().st_mtime_ns, p.stat().st_size)
                      for p in [self._real / "meta/info.json", *files])
        key = (str(self._real), stamp, tuple(self.video_keys))
        if key not in _EPISODES:
            if len(_EPISODES) >= 4:
                _EPISODES.clear()
            eps = self._v3_episodes(files) if self.version == V3 else self._legacy_episodes(files[0])
            _EPISODES[key] = meta.unique(eps, str(self.root / "meta"))
        return _EPISODES[key]

    def _shown(self, real: Path) -> Path:
        return self.root / real.relative_to(self._real)

    def _v3_episodes(self, files: list[Path]) -> list[Episode]:
        vcols = [f"videos/{k}/{c}" for k in self.video_keys
                 for c in ("chunk_index", "file_index", "from_timestamp", "to_timestamp")]
        cols = ["episode_index", "length", "tasks", "data/chunk_index", "data/file_index", *vcols]
        out = []
        for f in files:
            shown = self._shown(f)
            missing = [c for c in cols if c not in _parquet(f, str(shown), ValueError, schema=True).names]
            if missing:
                raise ValueError(f"{shown}: episode metadata has no columns {missing}; is it a {V3} dataset? "
                                 "re-convert it")
            for r in _parquet(f, str(shown), ValueError, columns=cols).to_pylist():
                i = meta.index(r["episode_index"], "episode_index", str(shown))
                where = f"{shown} episode_index {i}"
                data = self._fill("data_path", where, chunk_index=meta.index(r["data/chunk_index"],
                                                                             "data/chunk_index", where),
                                  file_index=meta.index(r["data/file_index"], "data/file_index", where))
                videos = {}
                for k in self.video_keys:
                    c = {n: r[f"videos/{k}/{n}"] for n in ("chunk_index", "file_index", "from_timestamp",
                                                           "to_timestamp")}
                    start = meta.seconds(c["from_timestamp"], f"videos/{k}/from_timestamp", where)
                    end = meta.seconds(c["to_timestamp"], f"videos/{k}/to_timestamp", where)
                    if end < start:
                        raise ValueError(f"{where}: videos/{k}/to_timestamp={end} is before from_timestamp={start}; "
                                         "fix the episode metadata or re-convert the dataset")
                    rel = self._fill("video_path", where, video_key=k,
                                     chunk_index=meta.index(c["chunk_index"], f"videos/{k}/chunk_index", where),
                                     file_index=meta.index(c["file_index"], f"videos/{k}/file_index", where))
                    videos[k] = (rel, start, end)
                out.append(Episode(i, meta.index(r["length"], "length", where), meta.tasks(r["tasks"], where),
                                   data, videos))
        return out

    def _legacy_episodes(self, path: Path) -> list[Episode]:
        shown, out = self._shown(path), []
        for n, line in enumerate(meta.read_bounded(path, shown).splitlines(), 1):
            if not line.strip():
                continue
            r = meta.loads(line, f"{shown} line {n}")
            if not isinstance(r, dict):
                raise ValueError(f"{shown} line {n}: expected a JSON object per line; re-download meta/")
            i = meta.index(r.get("episode_index"), "episode_index", f"{shown} line {n}")
            where = f"{shown} line {n} (episode_index {i})"
            chunk = i // self.chunks_size
            data = self._fill("data_path", where, episode_chunk=chunk, episode_index=i)
            videos = {k: (self._fill("video_path", where, episode_chunk=chunk, video_key=k, episode_index=i), 0.0, None)
                      for k in self.video_keys}
            out.append(Episode(i, meta.index(r.get("length"), "length", where), meta.tasks(r.get("tasks"), where),
                               data, videos))
        return out

    def _fill(self, field: str, where: str, **values: object) -> str:
        """A checked template filled with checked values; the result is checked to stay in the root."""
        rel = (self.data_path if field == "data_path" else self.video_path).format(**values)
        return meta.relative(rel, f"{where}: {field}", ValueError)

    def _tasks_of(self, table, episode_id: str) -> tuple[str, ...]:  # noqa: ANN001 (pyarrow.Table)
        """Tasks from the per-row task_index, for metadata without a ``tasks`` entry."""
        if "task_index" not in table.column_names:
            return ()
        rel = "meta/tasks.parquet" if self.version == V3 else "meta/tasks.jsonl"
        shown = self.root / rel
        where = f"episode {episode_id!r}: {shown}"
        path = self._file(rel, where, EpisodeError)
        if not path.is_file():
            raise EpisodeError(f"{where} is missing, and meta/episodes lists no tasks; re-download meta/")
        if self.version == V3:
            t = _parquet(path, where, EpisodeError)
            name = next((c for c in ("task", "__index_level_0__") if c in t.column_names), t.column_names[-1])
            if "task_index" not in t.column_names:
                raise EpisodeError(f"{where} has no task_index column; re-download meta/")
            names = dict(zip(t.column("task_index").to_pylist(), t.column(name).to_pylist()))
        else:
            raw = meta.read_bounded(path, shown, error=EpisodeError)
            rows = [meta.loads(x, f"{where} line {n}") for n, x in enumerate(raw.splitlines(), 1)
                    if x.strip()]
            names = {r.get("task_index"): r.get("task") for r in rows if isinstance(r, dict)}
        out = []
        for i in dict.fromkeys(table.column("task_index").to_pylist()):
            if not isinstance(names.get(i), str):
                raise EpisodeError(f"{where} has no task for task_index={i!r}; re-download meta/")
            out.append(names[i])
        return tuple(out)


def _numeric(dtype: str) -> bool:
    try:
        return np.dtype(dtype).kind in "biuf"
    except (TypeError, ValueError, OverflowError):
        return False


def _parquet(path: Path, where: str, error: type[ValueError], *, schema: bool = False, **kw: object):  # noqa: ANN202
    """``pq.read_table(path, **kw)`` (or its schema) on the local file system; any failure names the file."""
    import pyarrow as pa
    import pyarrow.fs
    import pyarrow.parquet as pq

    local = pyarrow.fs.LocalFileSystem()  # never a URI read from the path
    try:
        return pq.read_schema(path, filesystem=local) if schema else pq.read_table(path, filesystem=local, **kw)
    except (pa.ArrowException, OSError, ValueError, TypeError) as e:
        raise error(f"{where}: cannot read the parquet file ({type(e).__name__}: {e}); re-download or re-convert "
                    "the dataset") from None


def _check_frame_index(col, where: str) -> None:  # noqa: ANN001 (pyarrow.ChunkedArray)
    """An episode's rows, sorted by frame_index, must be frames 0..n-1 exactly once each."""
    import pyarrow as pa

    got = col.to_numpy() if pa.types.is_integer(col.type) and not col.null_count else None
    if got is None or not np.array_equal(got, np.arange(len(col))):
        first = None if got is None else next(int(i) for i, g in enumerate(got) if g != i)
        raise EpisodeError(f"{where}: frame_index is not 0..{len(col) - 1} (type {col.type}"
                           f"{'' if first is None else f', row {first} holds {got[first]}'}); re-convert the dataset")


def _timestamps(col, where: str) -> np.ndarray:  # noqa: ANN001 (pyarrow.ChunkedArray)
    import pyarrow as pa

    if not (pa.types.is_floating(col.type) or pa.types.is_integer(col.type)) or col.null_count:
        raise EpisodeError(f"{where}: timestamp column is {col.type} with {col.null_count} nulls; it must hold "
                           "seconds as numbers; re-convert the dataset")
    times = col.to_numpy().astype(np.float64)
    bad = np.flatnonzero(~np.isfinite(times) | (times < 0))
    if bad.size:
        raise EpisodeError(f"{where}: row {bad[0]} has timestamp {times[bad[0]]}; timestamps must be finite "
                           "seconds >= 0, re-convert the dataset")
    return times


def _column(col, shape: tuple[int, ...], where: str) -> np.ndarray:  # noqa: ANN001 (pyarrow.ChunkedArray)
    """A parquet column (scalars, or nested lists) as one (n, *shape) array, without a Python loop."""
    import pyarrow as pa
    import pyarrow.compute as pc

    arr, n, nested = col.combine_chunks(), len(col), False
    while pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type) or pa.types.is_fixed_size_list(arr.type):
        if arr.null_count:
            raise EpisodeError(f"{where}: {arr.null_count} null values; fill or drop those rows")
        sizes = pc.min_max(pc.list_value_length(arr))
        if len(arr) and sizes["min"].as_py() != sizes["max"].as_py():
            raise EpisodeError(f"{where}: rows hold lists of {sizes['min']} to {sizes['max']} values; every row "
                               "needs the same shape, fix the data")
        arr, nested = arr.flatten(), True
    if arr.null_count:
        raise EpisodeError(f"{where}: {arr.null_count} null values; fill or drop those rows")
    values = arr.to_numpy(zero_copy_only=False)
    if values.dtype.kind not in "biuf":
        raise EpisodeError(f"{where}: the column holds {arr.type}, not the numbers meta/info.json declares; "
                           "fix the feature's dtype or the data")
    if not nested:
        return values
    if not n:
        return values.reshape(0, *shape)
    size = int(np.prod(shape)) if shape else 0
    return values.reshape(n, *shape) if size and values.size == n * size else values.reshape(n, -1)


def _image_frames(col, root: Path, where: str) -> Iterator[np.ndarray]:  # noqa: ANN001 (pyarrow.ChunkedArray)
    """Decode parquet image cells ({bytes, path} structs, or bytes) to RGB, one at a time.

    A cell without bytes names a file by ``path``; it is read only when it resolves inside ``root``. A file is
    refused by its size before it is read, and every image by its header before it is decoded (`imagehead`): its
    sides, its pixels and frame 0's size.
    """
    first: tuple[int, int] | None = None
    for i, cell in enumerate(col.to_pylist()):
        data, path = (cell, None) if isinstance(cell, bytes) else (None, None)
        if isinstance(cell, dict):
            data, path = cell.get("bytes"), cell.get("path")
        elif cell is not None and data is None:
            raise EpisodeError(f"{where} row {i}: an image cell is {type(cell).__name__}, not {{bytes, path}}; "
                               "re-export the dataset with images embedded")
        if data is None and path:
            what = f"{where} row {i}: image path"
            real = meta.regular_file(meta.inside(root, path, what, EpisodeError), what, EpisodeError)
            if not real.is_file():
                raise EpisodeError(f"{what} {path!r} is missing; re-export the dataset with images embedded")
            data = read_image(real, f"{what} {path!r}")
        if data is not None and not isinstance(data, bytes):
            raise EpisodeError(f"{where} row {i}: image bytes are {type(data).__name__}; re-export the dataset")
        if data is not None:
            size = check_header(data, f"{where} row {i}: image", first, i)
            first = first or size
        img = None if data is None else cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
        if img is None:
            raise EpisodeError(f"{where} row {i}: no decodable image bytes; re-export the dataset with images embedded")
        yield cv2.cvtColor(img, cv2.COLOR_BGR2RGB)


def _demuxer(path: Path, where: str) -> str:
    if not path.is_file():
        raise EpisodeError(f"{where}: video file is missing; re-download the dataset's videos/")
    if path.suffix.lower() not in VIDEO_SUFFIXES:
        raise EpisodeError(f"{where}: video_path gives a {path.suffix or 'suffix-less'} file; LeRobot videos are "
                           f"{', '.join(VIDEO_SUFFIXES)}; fix video_path in meta/info.json")
    return DEMUXERS[path.suffix.lower()]


def _copied(source: Callable[[], VideoSource], start: float, end: float | None, times: np.ndarray, fps: float,
            tol: float, where: str) -> Packets:
    """The packets of the frames the rows take (LeRobot's closest-frame rule, on demuxed timestamps), copied.

    Copying keeps whole frames only, so the rows must take consecutive frames, one each: a row that skips a
    frame or shares one with its neighbour (a dropped or doubled frame in the source) is refused. The times come
    from the copy's own demux, so the file is read once. ``source`` gives the camera's open file.
    """
    import av

    half = 0.5 / fps
    if not len(times):
        raise EpisodeError(f"{where}: the episode has no rows, so no frames to copy; remove it or pass --skip-bad")
    lo, hi = start + float(times.min()), start + float(times.max())
    try:
        p, shown = source().take(lo, hi + 2 * half)  # its own half-frame slack keeps the frame at hi
    except (av.FFmpegError, OSError, IndexError) as e:
        raise EpisodeError(f"{where}: cannot read the video ({type(e).__name__}: {e}); re-download it") from e
    except ValueError as e:  # copy_packets' refusals name the file and the fix
        raise EpisodeError(f"{where}: {e}") from None
    # candidates: the copied frames inside the episode's span (a leading packet may belong to the episode before)
    span = np.flatnonzero((shown >= start - half) & (shown < (np.inf if end is None else end - half)))
    taken = span[_closest(shown[span], start + times, start, tol, where)]
    if np.any(np.diff(taken) != 1) or len(p) != len(times) or taken[0] != p.lead:
        j = int(np.flatnonzero(np.diff(taken) != 1)[0]) + 1 if np.any(np.diff(taken) != 1) else 0
        raise EpisodeError(f"{where}: the rows do not take one frame each in order (row {j} takes the frame at "
                           f"{shown[taken[j]]:.6f}s; {len(p)} frames lie between the first and last row), so "
                           "the video cannot be copied frame for row; re-encode it with --codec av1")
    return p


def _video_frames(path: Path, start: float, end: float | None, times: np.ndarray, fps: float, tol: float,
                  where: str) -> Iterator[np.ndarray]:
    """Decode ``path`` from ``start`` and yield, per row time, the closest frame of the episode's span."""
    import av
    from av.video.reformatter import VideoReformatter

    # span edges sit half a frame out, so rounding never drops an edge frame
    demuxer, half = _demuxer(path, where), 0.5 / fps
    try:
        with av.open(str(path), format=demuxer) as container:
            length = container.duration / av.time_base if container.duration else None
            if length is not None and start > length + half:
                raise EpisodeError(f"{where}: from_timestamp {start:.6f}s lies past the video's end at {length:.6f}s; "
                                   "fix the episode metadata or re-download the video")
            decoded = itertools.dropwhile(lambda tf: tf[0] < start - half, _decode_from(container, start, half))
            if end is not None:  # frames past the span belong to the next episode in the file
                decoded = itertools.takewhile(lambda tf: tf[0] < end - half, decoded)  # stop decoding there
            rgb = VideoReformatter()  # one conversion context for the video: a frame's own builds one per frame
            yield from (rgb.reformat(f, format="rgb24").to_ndarray()
                        for f in _match(decoded, start + times, start, tol, where))
    except (av.FFmpegError, OSError, IndexError, OverflowError) as e:
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
           where: str) -> Iterator[object]:
    """LeRobot's rule on a stream: each query takes its closest item, within ``tol``; items are time-ordered."""
    it = iter(frames)
    prev, cur = None, next(it, None)
    for i, q in enumerate(queries):
        while cur is not None and cur[0] <= q:
            prev, cur = cur, next(it, None)
        best = min((c for c in (prev, cur) if c is not None), key=lambda c: abs(c[0] - q), default=None)
        if best is None or abs(best[0] - q) >= tol:
            raise _no_frame(i, q, None if best is None else best[0], start, tol, where)
        yield best[1]


def _closest(times: np.ndarray, queries: np.ndarray, start: float, tol: float, where: str) -> np.ndarray:
    """`_match` over increasing item ``times`` for all queries at once: each query's item index (for copied
    packets, whose times are known up front; `_match` streams decoded frames)."""
    # `_match` only moves forward: its last item at or before a query is the one at or before the largest so far
    after = np.searchsorted(times, np.maximum.accumulate(queries), side="right")
    prev, cur = np.maximum(after - 1, 0), np.minimum(after, len(times) - 1)
    if not len(times):
        raise _no_frame(0, float(queries[0]), None, start, tol, where)
    dp, dc = np.abs(times[prev] - queries), np.abs(times[cur] - queries)
    dp[after == 0], dc[after == len(times)] = np.inf, np.inf
    take_prev = dp <= dc  # a tie goes to the earlier frame, as min() over (prev, cur) gives it
    best, dist = np.where(take_prev, prev, cur), np.where(take_prev, dp, dc)
    far = np.flatnonzero(~(dist < tol))
    if len(far):
        i = int(far[0])
        raise _no_frame(i, float(queries[i]), float(times[best[i]]), start, tol, where)
    return best


def _no_frame(i: int, q: float, best: float | None, start: float, tol: float, where: str) -> EpisodeError:
    near = "no frame at all" if best is None else f"the closest frame is at {best:.6f}s"
    return EpisodeError(
        f"{where}: row {i} (timestamp {q - start:.6f}s, {q:.6f}s in the file) has no frame within "
        f"tolerance_s={tol}; {near}. The video is shorter than the episode or out of sync: re-encode it, "
        f"{TOLERANCE_HINT}")


# What the in-place index (`lerobot_ref`, ``--codec reference``) shares with this reader, so both read rows and match
# them to frames alike (public names over the private ones above).
parquet, column, timestamps, check_frame_index, closest, video_demuxer = (_parquet, _column, _timestamps,
                                                                         _check_frame_index, _closest, _demuxer)
LeRobotReader.tasks_of = LeRobotReader._tasks_of  # type: ignore[attr-defined]
