"""What a `ShardWriter` holds per frame written: its finished episodes' per-frame values in numpy columns, given back
whole (as lists) to whoever reads an entry."""

from __future__ import annotations

import tracemalloc

from episodepipes.sharding.write import entries
from episodepipes.sharding.write.writer import ShardWriter

LENGTH, FRAME = 200, 64


def _meta(i: int) -> dict:
    cams = {"front": {"height": 8, "width": 8, "source": "front", "source_height": 8, "source_width": 8}}
    return {"id": f"ep{i:05d}", "split": "train", "length": LENGTH, "fps": 10.0, "prompt": "", "cameras": cams,
            "arrays": {}}


def _frames(i: int) -> bytes:
    return bytes([i % 251]) * (FRAME * LENGTH)


def test_the_writer_holds_under_20_bytes_per_frame_written(tmp_path, monkeypatch):
    monkeypatch.setattr(entries, "_CHUNK", 4096)  # chunks small beside the frames written, so they average out
    with ShardWriter(tmp_path, shard_size=10**4 * FRAME, options={}) as w:
        w.add_frames(_meta(0), _frames(0), [FRAME] * LENGTH)
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for i in range(1, 101):
                w.add_frames(_meta(i), _frames(i), [FRAME] * LENGTH)
            held = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
    assert held / (100 * LENGTH) < 20, f"{held / (100 * LENGTH):.1f} bytes per frame"


def test_an_entry_read_back_is_the_one_added(tmp_path):
    with ShardWriter(tmp_path, shard_size=700 * FRAME, options={}) as w:  # episodes split over shards
        added = [w.add_frames(_meta(i), _frames(i), [FRAME] * LENGTH) for i in range(7)]
        assert len(w.episodes) == 7 and w.episodes.frames == 7 * LENGTH
        assert w.episodes[3] == added[3] and w.episodes[-1] == added[-1] and w.episodes[2:5] == added[2:5]
        assert list(w.episodes) == added and len(added[3]["segments"]) == 2
    again = ShardWriter(tmp_path / "again", shard_size=700 * FRAME, options={}, shards=w.shards, episodes=added)
    assert list(again.episodes) == added  # a resumed writer's entries, from the progress's lists
