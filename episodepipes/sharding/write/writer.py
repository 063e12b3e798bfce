"""`ShardWriter`: appends encoded episodes to size-capped tar shards and writes the index last.

Every shard is streamed to ``<name>.tmp`` and renamed when complete, and the index (format v2:
its columns, then ``index.json``) is written atomically at `close`, so a folder without an index is an
unfinished write and a shard under its final name is always whole. After each finished shard the writer calls
``on_shard(writer)``: `state()` then describes everything durable, which is what resume needs.
"""

from __future__ import annotations

import hashlib
import json
import os
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import numpy as np

from episodepipes import safefile
from episodepipes.codec import chunk
from episodepipes.format import FORMAT_NAME, FORMAT_VERSION, INDEX_NAME, TAR_END, shard_name
from episodepipes.index import v2 as indexv2
from episodepipes.sharding.write._writeback import start_writeback
from episodepipes.sharding.write.encode import EncodedEpisode
from episodepipes.sharding.write.entries import Entries

_WRITEBACK = 8 * 2**20  # bytes written between writeback requests


__all__ = ["ShardWriter", "frame_crcs", "index_json", "is_packed", "write_index"]


def frame_crcs(data: memoryview, sizes: list[int]) -> list[int]:
    """``zlib.crc32`` of each frame's bytes, frames laid back to back in ``data`` (slices, no copies)."""
    out, pos = [], 0
    for size in sizes:
        out.append(zlib.crc32(data[pos:pos + size]))
        pos += size
    return out


def index_json(shards: list[dict], episodes: list[dict], options: dict, **extra: object) -> bytes:
    """A version-1 index's bytes (every offset in the JSON); ``extra`` adds top-level fields (e.g. ``skipped``)."""
    data = {"format": FORMAT_NAME, "version": 1, "options": options,
            "shards": shards, "episodes": episodes, **extra}
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


def write_index(out: Path, shards: list[dict], episodes: list[dict], options: dict, *, extra: dict | None = None,
                version: int = FORMAT_VERSION, layout: str = "members") -> bytes:
    """Write the index of ``episodes`` (v1-style entries with segments) into ``out``, last and atomically.

    Version 2 (the default) writes the columns first and ``index.json`` last; version 1 one JSON file, for
    tools and tests that need an index as older episodepipes wrote it. Returns the ``index.json`` bytes.
    """
    if version == 1:
        if layout != "members":
            raise ValueError(f"{layout=} needs index version 2; version 1 holds only the members layout")
        raw = index_json(shards, episodes, options, **(extra or {}))
        safefile.write_file(out / INDEX_NAME, raw)
        return raw
    if version != 2:
        raise ValueError(f"{version=} should be 1 or 2")
    return indexv2.write(out, *indexv2.build(shards, episodes, options, extra or {}, layout=layout))


def is_packed(meta: dict) -> bool:
    """Whether an episode entry is in the packed layout: it has a video camera (`encode_episode` decides)."""
    return any("codec" in c for c in meta["cameras"].values())


class ShardWriter:
    """Write episodes in order into ``out``; use as a context manager.

    ``shards``/``episodes`` restore a resumed run: the shards already finished and the index
    entries of the episodes they complete. A partially written episode is continued with
    ``add(..., start=frame, segments=...)``.
    """

    def __init__(self, out: str | os.PathLike, *, shard_size: int, options: dict,
                 shards: list[dict] | None = None, episodes: list[dict] | None = None,
                 extra: dict | None = None, on_shard: Callable[[ShardWriter], None] | None = None,
                 version: int = FORMAT_VERSION) -> None:
        """Nothing is opened until the first frame is added.

        Args:
            out: the output folder (created if missing).
            shard_size: bytes after which a shard is closed (the frame reaching it ends the shard).
            options: the write options, recorded in the index.
            shards: finished shards of a resumed run.
            episodes: index entries of the episodes those shards complete.
            extra: top-level index fields (``skipped``, ``job``).
            on_shard: called with the writer after each finished shard.
            version: the index format `close` writes: 2, or 1 as older episodepipes wrote it.
        """
        self.out = Path(out)
        self.shard_size = int(shard_size)
        self.options = options
        self.shards: list[dict] = list(shards or [])
        self.episodes = Entries(packed=bool(episodes) and is_packed(episodes[0]))  # per-frame values in numpy
        for e in episodes or []:
            self.episodes.append(e)
        self.extra = extra if extra is not None else {}
        self.on_shard = on_shard
        self.version = version  # of the index `close` writes: 2, or 1 as older episodepipes wrote it
        self.pending: dict | None = None  # the episode being added: finished segments, next frame
        self._file: BinaryIO | None = None
        self._hash = hashlib.sha256()
        self._pos = 0
        self._synced = 0  # bytes of the open shard already handed to `start_writeback`
        self._samples = 0
        self.layout: str | None = None  # of every episode: "members" or "packed", set by the first one
        if self.episodes:
            self.layout = "packed" if self.episodes.packed else "members"

    @property
    def next_shard(self) -> int:
        """The number of the shard being written (or opened by the next frame): the finished shards' count."""
        return len(self.shards)

    def __enter__(self) -> ShardWriter:
        self.out.mkdir(parents=True, exist_ok=True)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:  # noqa: ANN001
        if exc_type is None:
            self.close()
        elif self._file is not None:
            self._file.close()

    def add(self, enc: EncodedEpisode, *, start: int = 0, segments: list[dict] | None = None) -> dict:
        """Append one episode; returns its index entry (with byte-range segments).

        Args:
            enc: the encoded episode (its index metadata, tar bytes and per-frame sizes).
            start: the first frame not yet written; frames before it are in ``segments`` already (a resumed
                episode), 0 for a new one.
            segments: the episode's segments already written (index-entry dicts), continued by the new
                frames; their ``crc32`` lists are recomputed from ``data``. None for a new episode.
        """
        return self.add_frames(enc.meta, enc.data(), enc.sizes, start=start, segments=segments)

    def add_frames(self, meta: dict, data: bytes | memoryview, sizes: list[int], *, start: int = 0,
                   segments: list[dict] | None = None) -> dict:
        """Append frames ``start:`` of the episode described by ``meta``.

        ``data`` is the tar bytes of all its frames back to back and ``sizes`` each frame's share. Each
        run of frames that lands in one shard is hashed and written with one call. Every segment gets the
        ``crc32`` of each of its frames, computed here from ``data``, so resumed and merged segments get
        the same checksums as a single run.

        Args:
            meta: the episode's index entry without ``segments`` (id, split, length, fps, prompt, cameras,
                arrays); the returned entry is it plus the segments.
            data: the tar bytes of all the episode's frames, back to back, from frame 0.
            sizes: each frame's byte count in ``data``, in frame order; a shard ends after the frame that
                brings it to ``shard_size``, so frames never straddle shards.
            start: the first frame not yet written; frames before it are in ``segments`` already (a resumed
                episode), 0 for a new one.
            segments: the episode's segments already written (index-entry dicts), continued by the new
                frames; their ``crc32`` lists are recomputed from ``data``. None for a new episode.
        """
        layout = "packed" if is_packed(meta) else "members"
        if self.layout is None:
            self.layout = layout
            self.episodes = Entries(packed=layout == "packed")
        elif layout != self.layout:
            raise ValueError(f"episode {meta['id']!r} is in the {layout} layout, the episodes before it in the "
                             f"{self.layout} one (video cameras in some, none in others); write them with one --codec")
        segs = [dict(s, offsets=list(s["offsets"])) for s in segments or []]
        self.pending = {"segments": segs, "frame": start}
        pos, n = sum(sizes[:start]), len(sizes)
        with memoryview(data) as view:
            if layout == "packed":
                sp = chunk.spans(view, where=f"episode {meta['id']!r}")
                if sp.spans != list(sizes):
                    raise ValueError(f"episode {meta['id']!r}: its frame sizes do not match its packed chunks")
                rec = np.cumsum([0, *sizes[:-1]], dtype=np.int64) + np.asarray(sp.heads, np.int64)
                crcs = [zlib.crc32(view[a:a + b]) for a, b in zip(rec.tolist(), sp.sizes)]
                cut = sp.ends
            else:
                crcs, cut = frame_crcs(view, sizes), None
            for s in segs:  # a resumed episode's finished segments (maybe from a run without checksums)
                self._frame_fields(s, crcs, sp if cut is not None else None)
            i = start
            while i < n:
                if self._samples and self._pos >= self.shard_size:
                    self.pending["frame"] = i
                    self._flush()
                if not segs or segs[-1]["shard"] != self.next_shard:
                    segs.append({"shard": self.next_shard, "first": i, "count": 0, "offsets": [], "end": 0,
                                 "crc32": []})
                seg, end, first = segs[-1], self._pos, i
                while i < n:  # frames go in while the shard is below its size; the one reaching it ends the run
                    seg["offsets"].append(end)
                    end += sizes[i]
                    i += 1
                    if end >= self.shard_size and (cut is None or cut[i - 1]):  # packed: at a chunk's end only
                        break
                run = end - self._pos
                self._write(view[pos:pos + run])
                pos += run
                seg["count"] += i - first
                seg["end"] = self._pos
                self._frame_fields(seg, crcs, sp if cut is not None else None)
                self._samples += i - first
        self.pending = None
        entry = dict(meta, segments=segs)
        self.episodes.append(entry)
        return entry

    @staticmethod
    def _frame_fields(seg: dict, crcs: list[int], sp: chunk.Spans | None) -> None:
        """A segment's per-frame lists from the episode's: crc32, and in the packed layout heads, sizes, keys."""
        a, b = seg["first"], seg["first"] + seg["count"]
        seg["crc32"] = crcs[a:b]
        if sp is not None:
            seg.update(heads=sp.heads[a:b], sizes=sp.sizes[a:b], keys=sp.keys[a:b])

    def _write(self, data: bytes) -> None:
        if self._file is None:
            self._file = safefile.open_new(self.out / (shard_name(self.next_shard) + ".tmp"))
        self._file.write(data)
        self._hash.update(data)
        self._pos += len(data)
        if self._pos - self._synced >= _WRITEBACK:
            self._file.flush()
            start_writeback(self._file.fileno(), self._synced, self._pos - self._synced)
            self._synced = self._pos

    def _flush(self) -> None:
        if not self._samples or self._file is None:
            return
        self._write(TAR_END)
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        name = shard_name(self.next_shard)
        os.replace(self.out / (name + ".tmp"), self.out / name)
        self.shards.append({"name": name, "bytes": self._pos, "sha256": self._hash.hexdigest(),
                            "samples": self._samples})
        self._file, self._hash, self._pos, self._synced, self._samples = None, hashlib.sha256(), 0, 0, 0
        if self.on_shard is not None:
            try:
                self.on_shard(self)
            except BaseException:  # not recorded (a full disk, say): no final name for it, a resume rewrites it
                self.shards.pop()
                os.replace(self.out / name, self.out / (name + ".tmp"))
                raise

    def close(self) -> None:
        """Finish the open shard (end-of-archive, fsync, rename into place), then write the index.

        The context manager calls it on a clean exit only: after an error the unfinished shard stays a
        ``.tmp`` file and no index is written, so a resumed run continues from the finished shards.
        """
        self._flush()
        if self.version != 2:
            write_index(self.out, self.shards, list(self.episodes), self.options, extra=self.extra,
                        version=self.version, layout=self.layout or "members")
            return
        entries, offsets, crcs = self.episodes.index_parts()
        indexv2.write(self.out, *indexv2.build(self.shards, entries, self.options, self.extra, offsets=offsets,
                                               crcs=crcs, layout=self.layout or "members"))
