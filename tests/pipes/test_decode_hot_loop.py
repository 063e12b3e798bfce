"""What the decode hot loop no longer does per frame, held by counting: timestamps come from the index (equal to the
writer's json members, never parsed) and decode processes freeze what they inherit from the collector's walks."""

from __future__ import annotations

import gc
import json

import pytest
from helpers import make_shards

from episodepipes.pipes import EpisodeIndex, ShardReader, video_pipe
from episodepipes.pipes.plan import Item
from episodepipes.pipes.train import train_pipe


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    # 7 fps: frame / fps is a repeating binary fraction, so the writer's rounding to the ns shows
    return EpisodeIndex.open(make_shards(tmp_path_factory.mktemp("hot") / "s", num_episodes=3, length=15,
                                         height=16, width=24, fps=7.0))


def written_stamps(index):
    items = [Item(e.id, f) for e in index.episodes for f in range(e.length)]
    return {(r.item.episode, r.item.frame): json.loads(bytes(r.members["json"]))["timestamp"]
            for r in ShardReader(index, items)}


@pytest.mark.parametrize("method", ["thread", "process"])
def test_timestamps_are_the_writers_json_values(index, method):
    want = written_stamps(index)
    pipe = train_pipe(index, batch_size=5, seed=0, rank=0, world_size=1, method=method)
    got = {(e, int(f)): float(t) for b in pipe for e, f, t in zip(b["episode"], b["frame"], b["timestamp"])}
    assert got and all(got[k] == want[k] for k in got)  # bit for bit, not approximately
    vids = video_pipe(index, episodes=[e.id for e in index.episodes], batch_size=8, max_batches=100, method=method)
    got = {(e, int(f)): float(t) for b in vids for e, f, t in zip(b["episode"], b["frame"], b["timestamp"])}
    assert got == want


def freeze_count(sample: dict) -> dict:
    """A train transform (module level: it pickles to process workers) noting the worker's frozen objects."""
    sample["frozen"] = gc.get_freeze_count()
    return sample


def test_decode_processes_freeze_what_they_inherit(index):
    pipe = train_pipe(index, batch_size=5, seed=0, rank=0, world_size=1, method="process", transform=freeze_count)
    counts = [int(c) for b in pipe for c in b["frozen"]]
    assert counts and min(counts) > 1000  # the fork server's imports: numpy, cv2, torchdata, the library
    assert gc.get_freeze_count() == 0  # the process running the pass is the user's: left as it was
