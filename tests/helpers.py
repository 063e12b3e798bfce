"""Shared test helpers: data is made in tmp_path by the project's own writer. Add, don't change."""

from __future__ import annotations

from pathlib import Path

from episodepipes.sharding.encode import EncodeOptions, encode_episode
from episodepipes.sharding.synthetic import SyntheticReader
from episodepipes.sharding.writer import ShardWriter


def make_shards(out: Path, *, shard_size: int = 1 << 20, quality: int = 90, **reader_kw: object) -> Path:
    """Shard a `SyntheticReader(**reader_kw)` into ``out`` in-process and return ``out``."""
    reader = SyntheticReader(**reader_kw)  # type: ignore[arg-type]
    with ShardWriter(out, shard_size=shard_size, options={"jpeg_quality": quality}) as w:
        for eid in reader.episode_ids():
            w.add(encode_episode(reader.read(eid), EncodeOptions(jpeg_quality=quality)))
    return Path(out)
