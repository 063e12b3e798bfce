"""What a fleet merge is checked against: the same episodes and frame bytes as one job (shard cuts aside)."""

from __future__ import annotations

from pathlib import Path

from episodepipes.index import EpisodeIndex


def frames_of(out: Path) -> dict[str, list[bytes]]:
    """Every episode's frames' bytes (each checked against its crc32 by `verify` first), by id, with split,
    prompt and length."""
    index = EpisodeIndex.open(out, verify=True)
    got: dict[str, list] = {}
    data = [(Path(out) / s.name).read_bytes() for s in index.shards]
    for ep in index.episodes:
        shard, start, end = index.frame_ranges(ep.rows)
        blobs = [data[int(s)][int(a):int(b)] for s, a, b in zip(shard, start, end)]
        got[ep.id] = [ep.split, ep.prompt, len(blobs), *blobs]
    return got


def same_content(a: Path, b: Path) -> bool:
    """Equal episodes (ids, splits, prompts) and frames, byte for byte, and equal statistics."""
    sa, sb = EpisodeIndex.open(a), EpisodeIndex.open(b)
    return frames_of(a) == frames_of(b) and sa.options == sb.options and \
        (Path(a) / "index.stats.bin").read_bytes() == (Path(b) / "index.stats.bin").read_bytes()
