"""`EpisodeIndex`: the validated, read-only view of a shard folder's index (format v1 or v2).

Every length, plan and byte range in the pipes is computed from this object alone, so nothing
here touches a shard unless asked to (``verify=True``). It imports no torch, so the sharding CLI
(``info``, ``verify``, ``merge``) reads indexes through it too. Both versions are held as the v2
tables (`episodepipes.index.v2`), and `Episode` objects are made on first use from them, so opening
a v2 index costs nothing per frame.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import zlib
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from episodepipes.filebytes import mapped, sha256_file
from episodepipes.format import INDEX_NAME
from episodepipes.index import idcols
from episodepipes.index import stats as indexstats
from episodepipes.index.check import IndexFormatError
from episodepipes.index.columns import scanned
from episodepipes.index.episodes import Episode, LazyEpisodes
from episodepipes.index.idcols import IdList
from episodepipes.index.load import parse, read_local, read_remote
from episodepipes.index.load import tables as load_tables
from episodepipes.index.records import ArraySpec, Camera, Segment, Shard
from episodepipes.index.tables import Tables
from episodepipes.index.v1 import v1_layout
from episodepipes.index.v2 import LENGTH, SHARD, SPLIT
from episodepipes.normstats import StatsTable
from episodepipes.shardio import ByteSource, ShardMissingError, is_url, open_source

if TYPE_CHECKING:
    from episodepipes.remote import RemoteOptions

# The parts, one module each (this one holds the class that ties them): load (read, parse and check an index
# file), tables (the `Tables` the other parts read), records (Camera, ArraySpec, Segment, Shard), episodes (Episode,
# made on first use), stats (statistics on first use), v1 (the v1 layout merge takes), filebytes (sha256_file,
# mapped). The public names stay importable from here.
_SCAN_ROWS = 1 << 16  # rows of a table a scan reads at a time

__all__ = ["ArraySpec", "Camera", "Episode", "EpisodeIndex", "IndexFormatError", "Segment", "Shard", "sha256_file"]

RECENT = 1024  # ids `EpisodeIndex.episode` remembers (a few batches' worth)


class EpisodeIndex:
    """A shard folder's index. Use `EpisodeIndex.open(path)` (a folder, or an ``s3://``/``gs://``/``http(s)://`` root).

    Attributes:
        root: the shard folder (a `Path`), or the remote root URL (a `str`, without a trailing slash).
        source: the byte source every shard of this index is read through (the pipes use it).
    """

    def __init__(self, root: Path, data: dict, fingerprint: str = "") -> None:
        """``data`` is checked field by field before any of it is used.

        Args:
            root: the shard folder; shard names in ``data`` are plain file names inside it, and a v2 index's
                columns are its fixed column files.
            data: the parsed ``index.json``.
            fingerprint: the sha256 of the index file's bytes (`open` gives it).
        """
        self._load(Path(root), data, fingerprint, Path(root) / INDEX_NAME)

    def _load(self, root: Path | str, data: Any, fingerprint: str, file: Path | str,
              source: ByteSource | None = None) -> None:
        self.version, meta, self._v1, cols, seg_ok, attrs = load_tables(root, data, file, source)  # messages: file
        self.root, self.file, self.fingerprint = root, file, fingerprint  # fingerprint: resume checks the index
        self._source = source  # a remote root's, given by open; a local one is opened on first use
        self._folder, self._source_root = source, None  # a reference index's own folder, its source files' root
        self.referenced = "reference" in meta  # --codec reference: shards read from the source files (`referenced`)
        if self.referenced:  # its file names and counts checked now, its pieces when a pass first reads it
            from episodepipes.index.referenced import check_reference

            check_reference(meta["reference"], str(file))
            self._source = None
        self.meta: dict = meta
        self.options: dict = meta.get("options", {})
        self.shards: list[Shard] = [Shard(s["name"], s["bytes"], s["sha256"], s["samples"]) for s in meta["shards"]]
        if source is not None:  # a remote root's: its range cache keys a shard's entries by the sha256 vouched here
            from episodepipes.remote import RemoteSource

            if isinstance(source, RemoteSource):
                source.pin({s.name: s.sha256 for s in self.shards})
        self._tables = Tables.of(meta, cols, seg_ok, file, attrs)
        # episode n's id is ids[n], decoded from the mapped column on access: no list or dict of every id
        self.ids: Sequence[str] = IdList(self._tables.ids, self._tables.id_order)
        self.episodes: Sequence[Episode] = LazyEpisodes(self)
        self._by_shard: dict[int, list[int]] | None = None
        self._recent: dict[str, int] = {}  # ids looked up lately: a sample's decode asks for its episode many times
        self._data: dict | None = None
        self._stats: tuple[StatsTable | None, dict[tuple[str, str], str]] | None = None  # read on first use

    @property
    def tables(self) -> Tables:
        """The index's tables (episodes, segments, per-frame offsets, sizes and crc32, the extra columns, and the
        splits, prompts, fps, schemas and attributes their codes point at): the one value the code around the
        index reads them through. A view of the index's own (memory-mapped) arrays: treat it as read-only."""
        return self._tables

    def load_stats(self) -> tuple[StatsTable | None, dict[tuple[str, str], str]]:
        """(the statistics or None when the index has none, the reason for each (split, key) it lacks): the side
        file `episodepipes.normstats.sidefile.NAME`, or an older index's JSON fields. Read on first use (most opens
        never ask for them) and kept; checked field by field and against the episodes' step counts, raising
        `IndexFormatError` naming the file and the fix."""
        if self._stats is None:
            self._stats = indexstats.load(self.meta, self.tables, file=str(self.file), root=str(self.root),
                                          source=self._stats_source(), location=self.location)
        return self._stats

    def _stats_source(self) -> ByteSource | None:
        """Where the statistics are read from: the index folder's source (a reference index's own folder, never the
        dataset it points into), or None for a local folder."""
        if self.referenced:
            return self._folder
        return self.source if self.remote else None

    @classmethod
    def open(cls, path: str | os.PathLike, *, verify: bool = False, options: RemoteOptions | None = None,
             source_root: str | os.PathLike | None = None) -> EpisodeIndex:
        """Read and validate ``<path>/index.json`` (``path`` may also be the json file itself).

        A v2 index maps its columns; a v1 index is parsed whole, and logs once per process that
        ``episodepipes-shard upgrade`` rewrites it as v2.

        Args:
            path: the shard folder, or its ``index.json``; a missing index raises FileNotFoundError saying
                whether the folder exists (an unfinished write) or not. Or a remote root (``s3://bucket/prefix``,
                ``gs://...``, ``https://host/prefix``) whose ``index.json`` (and v2 columns) are read through its
                byte source and validated exactly as local ones.
            verify: also check every shard now (`verify`: existence, size, sha256, crc32), raising for the
                first problem; off by default because it reads every byte (a remote root downloads them).
            options: how a remote root is read (`episodepipes.remote.RemoteOptions`); a local folder ignores them.
            source_root: for an index written with ``--codec reference``, the root of the dataset whose files it
                points into (a folder, or an ``s3://``, ``gs://``, ``https://`` root); None: the folder the index
                lies in, if it was written inside the dataset (`episodepipes.index.referenced`). Other indexes
                ignore it.
        """
        if is_url(path):
            source, file, raw = read_remote(str(path), options)
            root: Path | str = source.root
        else:
            (root, file, raw), source = read_local(path), None
        index = cls.__new__(cls)
        index._load(root, parse(raw, file), hashlib.sha256(raw).hexdigest(), file, source)
        index._source_root = source_root
        if verify:
            index.verify()
        return index

    @property
    def remote(self) -> bool:
        """Whether the shards are read through `source`, never as local files: under a remote root, or in a
        dataset's own files (``--codec reference``)."""
        return isinstance(self.root, str) or self.referenced

    @property
    def source(self) -> ByteSource:
        """The byte source of this index's root, opened on first use (opening connects to nothing)."""
        if self._source is None and self.referenced:
            from episodepipes.index.referenced import open_reference

            folder = self._folder or open_source(self.root)
            self._source = open_reference(self.meta, self.root, folder, str(self.file), self._source_root,
                                          getattr(self._folder, "options", None))
        if self._source is None:
            self._source = open_source(self.root)
        return self._source

    def location(self, name: str) -> str:
        """Where the file ``name`` of this dataset is, for messages (a path, or the object's URL).

        Args:
            name: a file name inside the root (a shard's, a column's, or ``index.json``).
        """
        return f"{self.root}/{name}" if self.remote else str(Path(self.root) / name)

    def shard_size(self, shard: int) -> int | None:
        """A shard file's size in bytes, or None if it is missing.

        Args:
            shard: a shard number, an index into `shards`.
        """
        if not self.remote:
            p = self.shard_path(shard)
            return p.stat().st_size if p.exists() else None
        try:
            return self.source.size(self.shards[shard].name)
        except ShardMissingError:
            return None

    @contextlib.contextmanager
    def shard_bytes(self, shard: int) -> Iterator[memoryview]:
        """A shard's whole bytes: memory-mapped from a local folder, downloaded (one GET) from a remote root.

        Args:
            shard: a shard number, an index into `shards`.
        """
        if not self.remote:
            with mapped(self.shard_path(shard)) as view:
                yield view
            return
        name = self.shards[shard].name
        with memoryview(self.source.read(name, 0, self.shard_size(shard) or 0)) as view:
            yield view

    def __reduce_ex__(self, protocol: int) -> tuple:
        # a spawned worker maps the columns again (shared pages) instead of receiving a copy of them
        if self.referenced:  # reopened with its source root (its source holds open files)
            return (functools.partial(EpisodeIndex.open, source_root=self._source_root),
                    (self.root if isinstance(self.root, str) else str(self.file),))
        if self.remote:  # a remote one pickles what it read (its source and range-read columns as descriptions):
            return super().__reduce_ex__(protocol)  # the worker fetches nothing again, and rows only on use
        if self.version == 2:
            return EpisodeIndex.open, (str(self.file),)
        return super().__reduce_ex__(protocol)

    @property
    def data(self) -> dict:
        """The index in the v1 layout (every episode entry with its segments and offsets), for tools such as
        merge. A v1 index gives its parsed JSON; a v2 index builds it on first use, at a cost per frame."""
        if self._v1 is not None:
            return self._v1
        if self._data is None:
            self._data = v1_layout(self.meta, self.tables, self.ids)
        return self._data

    @property
    def frames(self) -> int:
        """Frames in the index, over every episode."""
        return int(self.meta["frames"])

    @property
    def has_crc(self) -> bool:
        """Whether every frame has a crc32 (False for v1 indexes written before them, upgraded without --crc)."""
        return self._tables.crc is not None

    @property
    def lengths(self) -> np.ndarray:
        """Every episode's length (uint64), in index order."""
        return self._tables.episodes[:, LENGTH]

    def episode(self, episode_id: str) -> Episode:
        """The episode with this id.

        Args:
            episode_id: the episode's id; an unknown one raises KeyError naming up to five close matches.
        """
        n = self._recent.get(episode_id, -1) if isinstance(episode_id, str) else -2
        if n == -1:
            n = int(self._tables.numbers([episode_id])[0])
            if n >= 0:
                if len(self._recent) >= RECENT:  # cleared whole, not evicted one by one: safe beside other threads
                    self._recent.clear()
                self._recent[episode_id] = n
        if n >= 0:
            return self.episodes[n]
        import difflib

        near = idcols.near(self._tables.ids, self._tables.id_order, str(episode_id))
        close = difflib.get_close_matches(str(episode_id), near, n=5, cutoff=0.5)
        raise KeyError(f"episode {episode_id!r} is not in {self.location(INDEX_NAME)}; "
                       f"close matches: {close or 'none'}")

    def numbers(self, ids: Sequence[str]) -> np.ndarray:
        """The episode number (position in `episodes`) of each id, int64, -1 for an id not in the index: one
        vectorised search of the mapped id column, nothing made per episode.

        Args:
            ids: episode ids.
        """
        return self._tables.numbers(ids)

    def stats(self, key: str, split: str = "train") -> dict[str, Any]:
        """Normalization statistics of array ``key`` over ``split``: ``count`` and float64 arrays of the step
        shape: ``mean``, ``std`` (ddof=0), ``min``, ``max``, ``q01``, ``q10``, ``q50``, ``q90``, ``q99``.

        Computed by the writer over every episode of the split (exactly: merged jobs give the same numbers;
        quantiles within `episodepipes.normstats.REL_ERROR`). Pass the result to `Normalize.from_stats`.

        Args:
            key: an array key, e.g. ``"action"``.
            split: the split, ``"train"`` by default.
        """
        return indexstats.summary(self.load_stats(), self.file, key, split)

    def stats_keys(self) -> list[tuple[str, str]] | None:
        """Every (split, key) the index has statistics for or a reason for their absence, sorted; None when it
        has none at all (written before episodepipes computed them). Reads them, as `stats` does."""
        table, missing = self.load_stats()
        return None if table is None else sorted(set(table.keys()) | set(missing))

    def split_numbers(self, split: str) -> np.ndarray:
        """The numbers (positions in `episodes`) of the episodes of ``split``, in index order.

        Args:
            split: a split name, e.g. ``"train"``; an unknown one gives no episodes.
        """
        t = self._tables
        if split not in t.splits:
            return np.zeros(0, np.int64)
        code = t.splits.index(split)  # a block of the table at a time, its pages released after (`scanned`)
        return np.concatenate([np.zeros(0, np.int64)] + [
            a + np.flatnonzero(blk[:, SPLIT] == code) for a, blk in
            scanned(t.episodes, _SCAN_ROWS)])

    def split(self, split: str) -> list[Episode]:
        """The episodes of ``split``, in index order (which is shard order).

        Args:
            split: a split name, e.g. ``"train"``; an unknown one gives an empty list.
        """
        return [self.episodes[n] for n in self.split_numbers(split).tolist()]

    def shard_path(self, shard: int) -> Path:
        """The local file of a shard; a remote index has none (read it through `source`).

        Args:
            shard: a shard number, an index into `shards`.
        """
        if self.remote:
            raise ValueError(f"{self.root} is a remote root: its shards have no local path; read them through "
                             "index.source")
        return Path(self.root) / self.shards[shard].name

    def frame_ranges(self, rows: np.ndarray, numbers: np.ndarray | None = None
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(shard, start byte, end byte) of many frame rows at once, as three arrays.

        Args:
            rows: frame rows (`Episode.rows`), any order.
            numbers: the episode each row is in, when the caller knows it (a train reader does): the lookup then
                reads only those episodes' rows of the tables, what the rows need and no more; None: found by a
                search of the tables (O(log) reads per row).
        """
        rows, t = np.asarray(rows, np.int64), self._tables
        if numbers is None:
            seg = t.segment_of_rows(rows)  # O(log) reads per row: no column is copied
            t.check_segments(np.unique(seg).tolist())
        else:
            seg = t.segment_in_episodes(rows, numbers)
            js, at = np.unique(seg, return_index=True)
            t.check_segments(js.tolist(), np.asarray(numbers, np.int64)[at].tolist())
        start = t.offset[rows]
        return t.segments[seg, SHARD], start, start + t.size[rows]

    def frame_crcs(self, rows: np.ndarray) -> np.ndarray | None:
        """The crc32 of many frame rows, or None when the index has no checksums.

        Args:
            rows: frame rows (`Episode.rows`), any order.
        """
        crc = self._tables.crc
        return None if crc is None else crc[np.asarray(rows, np.int64)]

    def segments_in(self, shard: int) -> list[tuple[Episode, Segment]]:
        """Every (episode, segment) whose frames are in ``shard``, in index order.

        Args:
            shard: a shard number, an index into `shards`.
        """
        if self._by_shard is None:
            self._by_shard, t = {}, self._tables
            owners = t.episode_of_segments(np.arange(len(t.segments)))
            for s, n in zip(t.segments[:, SHARD].tolist(), owners.tolist()):
                self._by_shard.setdefault(s, []).append(n)
        out = []
        for n in dict.fromkeys(self._by_shard.get(shard, [])):
            e = self.episodes[n]
            out += [(e, s) for s in e.segments if s.shard == shard]
        return out

    def bad_frames(self, shard: int, data: bytes | memoryview) -> list[tuple[str, int]]:
        """(episode id, frame) of every frame of ``shard`` whose bytes in ``data`` fail the index's crc32.

        Args:
            shard: a shard number, an index into `shards`.
            data: that shard file's bytes (e.g. `mapped`), sliced at each frame's byte range.
        """
        out = []
        for e, seg in self.segments_in(shard):
            rows = range(e.rows[seg.first], e.rows[seg.first] + seg.count)
            sizes = self._tables.size[rows.start:rows.stop].tolist()  # a frame's bytes (packed: gaps excluded)
            for k, (a, size, crc) in enumerate(zip(seg.offsets, sizes, seg.crc32 or ())):
                if zlib.crc32(data[a:a + size]) != crc:
                    out.append((e.id, seg.first + k))
        return out

    def problems(self, shards: Iterable[int] | None = None, *, members: bool = False) -> list[str]:
        """Every problem found, one line each naming the file (and episode and frame); empty when intact.

        Checks the v2 columns' sha256 and every frame's offsets, then each given shard (all by default):
        existence, size, sha256 and every frame's crc32 where the index has them; ``members`` also parses the
        tar headers at every frame (what the ``verify`` command does).

        Args:
            shards: shard numbers to check (all by default); the index's own checks always run.
            members: also parse every frame's tar members.
        """
        from episodepipes.index.verify import problems

        return [why for _, why in problems(self, shards, members=members)]

    def verify(self, shards: Iterable[int] | None = None) -> None:
        """Raise for the first problem `problems` finds (FileNotFoundError for a missing shard, else
        `IndexFormatError`), naming the shard and, for a crc32 mismatch, the first damaged frame.

        Args:
            shards: shard numbers to check (all by default).
        """
        from episodepipes.index.verify import problems

        for kind, why in problems(self, shards):
            raise kind(f"{self.root}: {why}")
