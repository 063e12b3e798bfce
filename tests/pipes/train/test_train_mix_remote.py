"""A mixture with one source on S3 (a real moto server behind a counting proxy) yields the local mixture's batches."""

from __future__ import annotations

import pytest
import torch
from helpers import make_shards

from episodepipes.pipes import Source
from episodepipes.pipes.train import train_pipe

BUCKET = "mix"


@pytest.fixture(scope="module")
def roots(moto, tmp_path_factory):
    d = tmp_path_factory.mktemp("mix-remote")
    a = make_shards(d / "a", shard_size=20_000, num_episodes=3, length=10, height=16, width=24, seed=1)
    b = make_shards(d / "b", shard_size=20_000, num_episodes=4, length=6, height=16, width=24, seed=2)
    moto.upload_dir(b, BUCKET, "b")
    return a, b


def _plain(pipe) -> list[dict]:  # noqa: ANN001
    return [{k: v.numpy().tobytes() if torch.is_tensor(v) else v for k, v in sorted(b.items())} for b in pipe]


def test_a_mixture_reads_an_s3_source_as_a_local_one(roots, proxy):
    a, b = roots
    kw = dict(batch_size=4, seed=3, num_workers=1, rank=0, world_size=1, history={"front": 2})
    local = _plain(train_pipe({"a": Source(a, 0.5), "b": Source(b, 0.5)}, **kw))
    remote = _plain(train_pipe({"a": Source(a, 0.5), "b": Source(f"s3://{BUCKET}/b", 0.5)}, **kw))
    assert remote == local and {s for x in remote for s in x["source"]} == {"a", "b"}
    assert any(rng is not None for _, _, rng in proxy.gets())  # b's frames came as ranged GETs
