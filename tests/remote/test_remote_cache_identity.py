"""The range cache keys entries by what a shard's bytes are known by (the index's sha256, or the store's ETag): a
dataset re-uploaded under the same root and names, read again through the same cache_dir, yields its new frames."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from remotecases import plain

from episodepipes.index import EpisodeIndex
from episodepipes.pipes import video_pipe
from episodepipes.remote import RemoteOptions, RemoteSource
from episodepipes.sharding.episode import EpisodeData
from episodepipes.sharding.formats.synthetic import SyntheticReader
from episodepipes.sharding.write import WriteOptions, write_shards

BUCKET = "identity"
READER = SyntheticReader(num_episodes=4, length=10, height=48, width=64)
KW = dict(episodes=READER.episode_ids(), batch_size=4, max_batches=100)


@dataclass(frozen=True)
class Relabelled:
    """``READER``'s episodes with every array shifted by one: the same images and sizes, so every frame lies at the
    same offset and length in the same shard names, with other bytes (a dataset re-written with fixed labels)."""

    def episode_ids(self) -> list[str]:
        return READER.episode_ids()

    def read(self, episode_id: str) -> EpisodeData:
        ep = READER.read(episode_id)
        return EpisodeData(id=ep.id, cameras=ep.cameras, arrays={k: v + 1 for k, v in ep.arrays.items()},
                           fps=ep.fps, prompt=ep.prompt, split=ep.split)


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("identity")
    old, new = base / "old", base / "new"
    for reader, out in ((READER, old), (Relabelled(), new)):
        write_shards(reader, out, WriteOptions(format="test", shard_size=60_000))
    a, b = EpisodeIndex.open(old), EpisodeIndex.open(new)
    assert [s.name for s in a.shards] == [s.name for s in b.shards] and len(a.shards) > 1
    ta, tb = a.tables, b.tables
    assert np.array_equal(ta.offset, tb.offset) and np.array_equal(ta.size, tb.size)  # every range the same
    assert [s.sha256 for s in a.shards] != [s.sha256 for s in b.shards]
    return old, new


@pytest.mark.parametrize("whole", [False, True], ids=["ranges", "whole shards"])
def test_a_dataset_reuploaded_at_the_same_root_is_read_anew_through_the_same_cache(moto, proxy, datasets, tmp_path,
                                                                                     whole):
    old, new = datasets
    prefix = f"reupload-{int(whole)}"
    url = f"s3://{BUCKET}/{prefix}"
    opts = RemoteOptions(cache_dir=tmp_path / "cache", cache_whole=whole, backoff=0.001)
    moto.upload_dir(old, BUCKET, prefix)
    want_old, want_new = plain(video_pipe(old, **KW)), plain(video_pipe(new, **KW))
    assert want_old != want_new
    assert plain(video_pipe(EpisodeIndex.open(url, options=opts), **KW)) == want_old
    proxy.reset()
    assert plain(video_pipe(EpisodeIndex.open(url, options=opts), **KW)) == want_old
    assert proxy.gets() and all(r[1].endswith(".npy") or r[1].endswith(".json") for r in proxy.gets())  # all cached
    moto.upload_dir(new, BUCKET, prefix)  # shards, columns and index replaced under the same names
    assert plain(video_pipe(EpisodeIndex.open(url, options=opts), **KW)) == want_new  # it served the old frames


def test_an_object_not_pinned_by_an_index_is_known_by_its_etag(moto, proxy, tmp_path):
    c = moto.client()
    c.put_object(Bucket=BUCKET, Key="loose/a.bin", Body=b"\1" * 4096)
    opts = RemoteOptions(cache_dir=tmp_path / "cache", backoff=0.001)
    url = f"s3://{BUCKET}/loose"
    assert RemoteSource(url, opts).read("a.bin", 100, 50) == b"\1" * 50
    c.put_object(Bucket=BUCKET, Key="loose/a.bin", Body=b"\2" * 4096)  # the same size, other bytes
    assert RemoteSource(url, opts).read("a.bin", 100, 50) == b"\2" * 50
    proxy.reset()
    assert RemoteSource(url, opts).read("a.bin", 100, 50) == b"\2" * 50
    assert [r[0] for r in proxy.requests] == ["HEAD"]  # the new entry, found by the object's new ETag
