import glob
import io
import tarfile

import hypothesis.extra.numpy as hnp
import hypothesis.strategies as st
import numpy as np
import pytest
import webdataset as wds
from helpers import make_shards
from hypothesis import given, settings

from episodepipes.format import npy_bytes, npy_load
from episodepipes.pipes import EpisodeIndex


def test_webdataset_iterates_every_shard_and_byte_ranges_hold_one_frame(tmp_path):
    out = make_shards(tmp_path / "s", num_episodes=4, length=12, shard_size=60_000)
    idx = EpisodeIndex.open(out, verify=True)
    assert len(idx.shards) > 2
    keys = [s["__key__"] for s in wds.WebDataset(sorted(glob.glob(f"{out}/shard-*.tar")), shardshuffle=False)]
    assert len(keys) == sum(e.length for e in idx.episodes) == sum(s.samples for s in idx.shards)
    for ep in idx.episodes:
        for f in (0, ep.length // 2, ep.length - 1):
            shard, a, b = ep.frame_range(f)
            blob = idx.shard_path(shard).read_bytes()[a:b]
            names = {m.name for m in tarfile.open(fileobj=io.BytesIO(blob))}
            assert names == {f"{ep.id}/{f:06d}.{x}" for x in
                             [*(f"{c}.jpg" for c in ep.cameras), *(f"{k}.npy" for k in ep.arrays), "json"]}


def test_same_input_gives_byte_identical_output(tmp_path):
    a = make_shards(tmp_path / "a", num_episodes=3, length=10, shard_size=50_000)
    b = make_shards(tmp_path / "b", num_episodes=3, length=10, shard_size=50_000)
    files = sorted(p.name for p in a.iterdir())
    assert files == sorted(p.name for p in b.iterdir())
    for name in files:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def test_index_from_another_version_is_refused_with_the_fix(tmp_path):
    out = make_shards(tmp_path / "s", num_episodes=1, length=3)
    text = (out / "index.json").read_text().replace('"version":2', '"version":99')
    (out / "index.json").write_text(text)
    with pytest.raises(ValueError, match=r"version 99.*re-shard"):
        EpisodeIndex.open(out)


def test_sha256_mismatch_names_the_shard(tmp_path):
    out = make_shards(tmp_path / "s", num_episodes=2, length=5)
    shard = sorted(out.glob("shard-*.tar"))[0]
    blob = bytearray(shard.read_bytes())
    blob[1000] ^= 0xFF
    shard.write_bytes(bytes(blob))
    EpisodeIndex.open(out)  # no I/O beyond the index without verify
    with pytest.raises(ValueError, match=shard.name):
        EpisodeIndex.open(out, verify=True)


def test_missing_index_says_unfinished_write(tmp_path):
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "_progress.json").write_text("{}")  # a write's trace; a bare folder is a source's message
    with pytest.raises(FileNotFoundError, match="unfinished write"):
        EpisodeIndex.open(tmp_path / "s")


@given(name=st.text(min_size=1, max_size=40).map(lambda s: s.replace("\0", "")).filter(bool),
       size=st.integers(0, 8**11 - 1))
@settings(max_examples=200, deadline=None)
def test_fast_tar_header_equals_tarfile(name, size):
    from episodepipes.format import _fast_header, _tar_header

    raw = name.encode("utf-8")
    if len(raw) <= 100:
        assert _fast_header(raw, size) == _tar_header(name, size)


@given(arr=hnp.arrays(dtype=st.sampled_from(["<f4", ">i2", "u1", "<f8", "?", "<U3", "<c8"]),
                      shape=hnp.array_shapes(min_dims=0, max_dims=3, max_side=4)))
@settings(max_examples=100, deadline=None)
def test_npy_bytes_equals_numpy_save(arr):
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    assert npy_bytes(arr) == buf.getvalue()
    np.testing.assert_array_equal(npy_load(npy_bytes(arr)), arr)


@given(arr=hnp.arrays(dtype=st.sampled_from(["<f4", ">f4", ">i2", "u1", "<f8", "?", "<U3", "S2", "<c8"]),
                      shape=hnp.array_shapes(min_dims=1, max_dims=3, max_side=4)),
       transpose=st.booleans())
@settings(max_examples=150, deadline=None)
def test_encoded_npy_members_equal_npy_bytes_of_each_step(arr, transpose):
    # the encoder shares one header and slices one buffer per array: it must give npy_bytes(a[i, ...]) exactly,
    # whose dtype is the array's, byte order and width included (a 1-D array's numpy scalars would lose them)
    from episodepipes.sharding.write.encode import _npy_rows

    if transpose and arr.ndim > 1:
        arr = arr.swapaxes(0, -1)
    rows = [bytes(r) for r in _npy_rows(arr)]
    assert rows == [npy_bytes(arr[i, ...]) for i in range(len(arr))]
    for r in rows:
        f = io.BytesIO(r)
        np.lib.format.read_magic(f)
        assert np.lib.format.read_array_header_1_0(f)[2] == arr.dtype


@given(names=st.lists(st.binary(min_size=1, max_size=30).map(lambda b: b.replace(b"\0", b"x")), min_size=1,
                      max_size=5),
       sizes=st.lists(st.integers(0, 8**11 - 1), min_size=5, max_size=5))
@settings(max_examples=100, deadline=None)
def test_vectorised_tar_headers_equal_one_at_a_time(names, sizes):
    from episodepipes.format import tar_header, tar_headers

    width = max(map(len, names))
    names = [n.ljust(width, b"y") for n in names]
    rows = tar_headers(np.frombuffer(b"".join(names), np.uint8).reshape(len(names), width),
                       np.array(sizes[:len(names)]))
    assert [r.tobytes() for r in rows] == [tar_header(n, s) for n, s in zip(names, sizes)]


class _BigEndianReader:
    """Synthetic episodes whose arrays are big-endian: '>f8' state, '>i4' counter (module level: picklable)."""

    def __init__(self) -> None:
        from episodepipes.sharding.formats.synthetic import SyntheticReader

        self.inner = SyntheticReader(num_episodes=2, length=6, height=16, width=16)

    def episode_ids(self) -> list[str]:
        return self.inner.episode_ids()

    def read(self, eid: str):
        ep = self.inner.read(eid)
        rng = np.random.default_rng(int(eid[2:]))
        ep.arrays = {"state": rng.normal(size=(6, 3)).astype(">f8"),
                     "count": (np.arange(6) * 1_000_003 + 7).astype(">i4")}
        ep.split = "val"
        return ep


def test_big_endian_arrays_round_trip_exactly_through_the_writer_and_the_pipes(tmp_path):
    # the index used to record dtype.name ("float64"), so '>f8' members were read as '<f8' garbage
    from episodepipes.pipes import metric_pipe, train_pipe
    from episodepipes.sharding.write.encode import EncodeOptions, encode_episode
    from episodepipes.sharding.write.writer import ShardWriter

    reader = _BigEndianReader()
    with ShardWriter(tmp_path / "s", shard_size=1 << 20, options={}) as w:
        for eid in reader.episode_ids():
            w.add(encode_episode(reader.read(eid), EncodeOptions()))
    idx = EpisodeIndex.open(tmp_path / "s")
    assert {k: a.dtype for k, a in idx.episodes[0].arrays.items()} == {"state": ">f8", "count": ">i4"}
    want = {eid: reader.read(eid).arrays for eid in reader.episode_ids()}
    seen = 0
    for batch in metric_pipe(tmp_path / "s", frames_per_episode=6, batch_size=4, num_workers=1):
        for i, (eid, f) in enumerate(zip(batch["episode"], batch["frame"].tolist())):
            np.testing.assert_array_equal(batch["state"][i].numpy(), want[eid]["state"][f])
            assert batch["count"][i].item() == want[eid]["count"][f]
            seen += 1
    assert seen == 12
    seen = 0
    for batch in train_pipe(tmp_path / "s", split="val", batch_size=4, seed=0, num_workers=1, history={"state": 2}):
        for i, (eid, f) in enumerate(zip(batch["episode"], batch["frame"].tolist())):
            steps = [max(f - 1, 0), f]  # history 2: steps t-1..t, padded at the episode start
            np.testing.assert_array_equal(batch["state"][i].numpy(), want[eid]["state"][steps])
            assert batch["count"][i].item() == want[eid]["count"][f]
            seen += 1
    assert seen == 12


@pytest.mark.parametrize("array", [
    np.array(["a", "bb", "ccc"], dtype=np.dtypes.StringDType()),  # what zarr 3 gives for string arrays
    np.array([{"a": 1}, None, 3], dtype=object),
    np.zeros(3, dtype=[("x", "<f4"), ("y", "<i2")]),
    np.zeros(3, dtype="V4"),
])
def test_arrays_that_npy_cannot_hold_exactly_are_refused_naming_episode_and_key(array):
    from episodepipes.sharding.episode import EpisodeError
    from episodepipes.sharding.formats.synthetic import SyntheticReader
    from episodepipes.sharding.write.encode import EncodeOptions, encode_episode

    reader = SyntheticReader(num_episodes=1, length=3, height=16, width=16)
    ep = reader.read("ep0000")
    ep.arrays["notes"] = array
    with pytest.raises(EpisodeError, match=r"episode 'ep0000' array 'notes' has dtype .*cannot store exactly"):
        encode_episode(ep, EncodeOptions())
    ep = reader.read("ep0000")  # the fix the message gives: fixed-width strings or numbers
    ep.arrays["notes"] = array.astype("U8") if array.dtype.kind == "T" else np.zeros(3, "<f4")
    assert encode_episode(ep, EncodeOptions()).meta["arrays"]["notes"]["dtype"] in ("<U8", "<f4")
