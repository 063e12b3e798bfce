"""`ShardWriter`: appends encoded episodes to size-capped tar shards and writes the index last.

Every shard is written to ``<name>.tmp`` and renamed when complete, and ``index.json`` is
written atomically at `close`, so a folder without an index is an unfinished write and a
shard under its final name is always whole.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from episodepipes.format import FORMAT_NAME, FORMAT_VERSION, INDEX_NAME, TAR_END, shard_name, tar_member
from episodepipes.sharding.encode import EncodedEpisode


def atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def index_json(shards: list[dict], episodes: list[dict], options: dict) -> bytes:
    data = {"format": FORMAT_NAME, "version": FORMAT_VERSION, "options": options,
            "shards": shards, "episodes": episodes}
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


class ShardWriter:
    """Write episodes in order into ``out``; use as a context manager."""

    def __init__(self, out: str | os.PathLike, *, shard_size: int, options: dict, first_shard: int = 0) -> None:
        self.out = Path(out)
        self.shard_size = int(shard_size)
        self.options = options
        self.shards: list[dict] = []
        self.episodes: list[dict] = []
        self._next = first_shard
        self._buf: list[bytes] = []
        self._pos = 0
        self._samples = 0

    def __enter__(self) -> ShardWriter:
        self.out.mkdir(parents=True, exist_ok=True)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:  # noqa: ANN001
        if exc_type is None:
            self.close()

    def add(self, enc: EncodedEpisode) -> dict:
        """Append one episode; returns its index entry (with byte-range segments)."""
        segments: list[dict] = []
        for i, members in enumerate(enc.samples):
            if self._samples and self._pos >= self.shard_size:
                self._flush()
            if not segments or segments[-1]["shard"] != self._next:
                segments.append({"shard": self._next, "first": i, "count": 0, "offsets": [], "end": 0})
            seg = segments[-1]
            seg["offsets"].append(self._pos)
            for name, data in members:
                block = tar_member(name, data)
                self._buf.append(block)
                self._pos += len(block)
            seg["count"] += 1
            seg["end"] = self._pos
            self._samples += 1
        entry = dict(enc.meta, segments=segments)
        self.episodes.append(entry)
        return entry

    def _flush(self) -> None:
        if not self._samples:
            return
        data = b"".join(self._buf) + TAR_END
        name = shard_name(self._next)
        atomic_write_bytes(self.out / name, data)
        self.shards.append({"name": name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                            "samples": self._samples})
        self._next += 1
        self._buf, self._pos, self._samples = [], 0, 0

    def close(self) -> None:
        self._flush()
        atomic_write_bytes(self.out / INDEX_NAME, index_json(self.shards, self.episodes, self.options))
