"""A remote file read whole (the index, the statistics side file) is refused by its size, asked first, before any of
it is downloaded: the limits and messages of the local reads."""

from __future__ import annotations

import numpy as np
import pytest

from episodepipes.index import EpisodeIndex, IndexFormatError
from episodepipes.index import load as indexopen
from episodepipes.index.columns import PROBE
from episodepipes.normstats import sidefile as statsfile
from episodepipes.remote import RemoteSource
from episodepipes.sharding.formats.synthetic import SyntheticReader
from episodepipes.sharding.write import WriteOptions, write_shards
from episodepipes.shardio import ShardTooLargeError

BUCKET = "limits"
PAD = 4 << 20  # what a refused file would have cost to download


# its own, not `shard_folder`: two moto uploads, one with a padded statistics file
@pytest.fixture(scope="module")
def shards(moto, tmp_path_factory):
    out = tmp_path_factory.mktemp("limits") / "s"
    write_shards(SyntheticReader(num_episodes=3, length=8, height=16, width=24), out,
                 WriteOptions(format="synthetic", shard_size=20_000), workers=1)
    moto.upload_dir(out, BUCKET, "ok")
    moto.upload_dir(out, BUCKET, "big-stats")
    moto.client().put_object(Bucket=BUCKET, Key=f"big-stats/{statsfile.NAME}",
                             Body=(out / statsfile.NAME).read_bytes() + b"\0" * PAD)
    return out


def _body_gets(proxy, name):
    return [r for r in proxy.gets() if r[1].endswith(f"/{name}")]


def test_a_remote_statistics_file_larger_than_the_index_says_is_refused_before_its_download(shards, proxy):
    url = f"s3://{BUCKET}/big-stats"
    index = EpisodeIndex.open(url)
    want = (shards / statsfile.NAME).stat().st_size + PAD
    proxy.reset()
    with pytest.raises(IndexFormatError, match=rf"^{url}/{statsfile.NAME} has {want} bytes or a sha256 that do not "
                                               rf"match {url}/index.json's") as e:
        index.stats("action")
    assert "\n" not in str(e.value) and "--recompute" in str(e.value)
    assert _body_gets(proxy, statsfile.NAME) == [] and proxy.body_bytes < 4096
    good = EpisodeIndex.open(f"s3://{BUCKET}/ok")
    got, want = good.stats("action"), EpisodeIndex.open(shards).stats("action")
    assert got.keys() == want.keys() and all(np.array_equal(got[k], want[k]) for k in got)


def test_a_remote_index_over_the_limit_is_refused_by_its_size_before_its_download(shards, proxy, monkeypatch):
    size = (shards / "index.json").stat().st_size
    monkeypatch.setattr(indexopen, "MAX_INDEX_BYTES", size - 1)  # the 16 GiB limit, lowered to what this one passes
    url = f"s3://{BUCKET}/ok"
    with pytest.raises(IndexFormatError, match=rf"^{url}/index.json holds {size} bytes, more than the {size - 1} "
                                               "expected; re-upload it or re-shard") as e:
        EpisodeIndex.open(url)
    assert "\n" not in str(e.value)
    assert _body_gets(proxy, "index.json") == [] and proxy.body_bytes == 0
    monkeypatch.setattr(indexopen, "MAX_INDEX_BYTES", size)
    assert len(EpisodeIndex.open(url).episodes) == 3


def test_read_file_with_a_limit_gets_exactly_the_objects_bytes_in_one_ranged_get(shards, proxy):
    raw = (shards / "index.json").read_bytes()
    with RemoteSource(f"s3://{BUCKET}/ok") as src:
        assert src.read_file("index.json", limit=len(raw)) == raw
        assert [r[2] for r in proxy.gets()] == [f"bytes=0-{len(raw) - 1}"]
        proxy.reset()
        with pytest.raises(ShardTooLargeError, match=rf"holds {len(raw)} bytes, more than the {len(raw) - 1}"):
            src.read_file("index.json", limit=len(raw) - 1)
        assert proxy.gets() == []


def test_a_remote_column_larger_than_its_dtype_and_shape_is_refused_before_its_download(shards, moto, proxy):
    from episodepipes.format import COLUMNS

    name = COLUMNS["offset"][0]
    moto.upload_dir(shards, BUCKET, "big-column")
    moto.client().put_object(Bucket=BUCKET, Key=f"big-column/{name}",
                             Body=(shards / name).read_bytes() + b"\0" * PAD)
    url = f"s3://{BUCKET}/big-column"
    # a per-frame column: its header and size come in one GET of its first bytes, and its size refuses it
    with pytest.raises(IndexFormatError, match=rf"^{url}/{name} holds {(shards / name).stat().st_size + PAD} bytes: "
                                               r"it is not a <u8 column of shape \[[0-9]+\]") as e:
        EpisodeIndex.open(url)
    assert "\n" not in str(e.value) and [r[2] for r in _body_gets(proxy, name)] == [f"bytes=0-{PROBE - 1}"]
    assert proxy.body_bytes < PAD
    proxy.reset()  # a column read whole at open (per episode): refused by its size after at most its expected bytes
    name = COLUMNS["episodes"][0]
    moto.client().put_object(Bucket=BUCKET, Key=f"big-column/{name}", Body=(shards / name).read_bytes() + b"\0" * PAD)
    moto.client().put_object(Bucket=BUCKET, Key=f"big-column/{COLUMNS['offset'][0]}",
                             Body=(shards / COLUMNS["offset"][0]).read_bytes())
    with pytest.raises(IndexFormatError, match=rf"^{url}/{name} holds {(shards / name).stat().st_size + PAD} bytes, "
                                               "more than the [0-9]+ expected; re-upload it or re-shard") as e:
        EpisodeIndex.open(url)
    assert "\n" not in str(e.value) and len(_body_gets(proxy, name)) == 1 and proxy.body_bytes < PAD
