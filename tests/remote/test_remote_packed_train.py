"""`train_pipe` on a packed (video-codec) index under an S3 root reads each frame's record once: the read-ahead fetches
the records back to each camera step's key frame, and the sample uses them (counted at moto behind the proxy)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import write_raw
from remotecases import plain

from episodepipes.index import EpisodeIndex
from episodepipes.pipes.train import train_pipe
from episodepipes.sharding.cli import main
from episodepipes.sharding.formats.synthetic import SyntheticReader

BUCKET = "packedtrain"
URL = f"s3://{BUCKET}/h264"


@pytest.fixture(scope="module")
def packed(moto, tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("packed-train")
    src = write_raw(tmp / "src", SyntheticReader(num_episodes=4, length=12, height=32, width=48))
    out = tmp / "h264"
    assert main(["write", str(src), str(out), "--workers", "1", "--shard-size", "12kB", "--codec", "h264",
                 "--gop", "4"]) == 0
    assert len(EpisodeIndex.open(out).shards) > 1
    moto.upload_dir(out, BUCKET, "h264")
    return out


def _shard_bytes(proxy) -> tuple[int, int]:  # noqa: ANN001
    """(GETs, bytes) of the shards (not the index's own files), from the ranges asked."""
    spans = [r.removeprefix("bytes=").split("-") for m, p, r in proxy.requests if m == "GET" and p.endswith(".tar")]
    return len(spans), sum(int(b) - int(a) + 1 for a, b in spans)


WINDOWS = dict(history={"front": 2, "state": 3}, horizon={"action": 4})


@pytest.mark.parametrize("options", [{}, WINDOWS, dict(shuffle="block", block_frames=6, window_blocks=2, **WINDOWS)])
def test_remote_packed_training_fetches_each_record_once(packed, proxy, options):
    kw = dict(batch_size=4, seed=3, rank=0, world_size=1, num_workers=1, **options)
    want = plain(train_pipe(packed, **kw))
    index = EpisodeIndex.open(URL)
    proxy.reset()
    pipe = train_pipe(index, **kw)
    assert plain(pipe) == want
    gets, fetched = _shard_bytes(proxy)
    used = pipe.stats["bytes_read"]  # every record a sample parsed, back to its key frames
    # each batch's records come in its read-ahead, near ones in one GET (at most 10% read between them), and the
    # sample reads nothing again: the old reader fetched the frames ahead and then their key ranges once more
    assert used > 0 and fetched <= 1.1 * used
    assert gets < len(want) * kw["batch_size"]  # fewer GETs than samples: a batch's near records share one
