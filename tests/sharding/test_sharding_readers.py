import pickle

import cv2
import numpy as np
import pytest
import webdataset as wds
from helpers import write_raw, write_zarr

from episodepipes.format import npy_load
from episodepipes.pipes import EpisodeIndex
from episodepipes.sharding.episode import EpisodeError, EpisodeReader
from episodepipes.sharding.formats.raw import RawReader
from episodepipes.sharding.formats.readers import detect_format, open_reader
from episodepipes.sharding.formats.synthetic import SyntheticReader
from episodepipes.sharding.formats.zarr_reader import ZarrReader
from episodepipes.sharding.write import WriteOptions, write_shards

SYN = SyntheticReader(num_episodes=3, length=8, height=64, width=80)


def _samples(out):
    urls = [str(out / s.name) for s in EpisodeIndex.open(out).shards]
    return {s["__key__"]: s for s in wds.WebDataset(urls, shardshuffle=False)}


def _check_round_trip(src_reader, out, *, tol):
    """Shard frames decode to the reader's frames within JPEG tolerance (q90: 4-6; the next frame: >12)."""
    write_shards(src_reader, out, WriteOptions(format="test", shard_size=40_000))
    idx, samples = EpisodeIndex.open(out, verify=True), _samples(out)
    assert len(samples) == sum(e.length for e in idx.episodes) == 3 * 8
    for eid in src_reader.episode_ids():
        src, ep, syn = src_reader.read(eid), idx.episode(eid), SYN.read(eid)
        assert (ep.fps, ep.prompt, ep.split, ep.length) == (syn.fps, syn.prompt, syn.split, 8)
        for cam, frames in src.cameras.items():
            assert (ep.cameras[cam].height, ep.cameras[cam].width) == (64, 80)
            refs = np.stack(list(frames)).astype(int)
            for i in range(len(refs)):
                jpg = samples[f"{eid}/{i:06d}"][f"{cam}.jpg"]
                got = cv2.imdecode(np.frombuffer(jpg, np.uint8), cv2.IMREAD_COLOR)  # BGR
                got = got if src.channel_order == "bgr" else cv2.cvtColor(got, cv2.COLOR_BGR2RGB)
                err = np.abs(refs - got).mean(axis=(1, 2, 3))
                assert err[i] < tol and err.argmin() == i, (eid, cam, i, err)
        for name, arr in syn.arrays.items():
            key = name if name in ep.arrays else f"obs_{name}"  # zarr stores state under obs/state
            for i in (0, 7):
                np.testing.assert_array_equal(npy_load(samples[f"{eid}/{i:06d}"][f"{key}.npy"]), arr[i])
    return idx


def test_raw_png_round_trip(tmp_path):
    reader = RawReader(write_raw(tmp_path / "src", SYN))
    _check_round_trip(reader, tmp_path / "out", tol=8.0)
    # png is lossless, so the shard is within JPEG tolerance of the synthetic frames themselves
    ep = reader.read("ep0000")
    assert ep.channel_order == "bgr"  # as OpenCV decodes: the encoder then needs no conversion
    syn = SYN.read("ep0000").cameras["front"]
    assert all(np.array_equal(a[..., ::-1], b) for a, b in zip(ep.cameras["front"], syn))


def test_raw_mp4_round_trip_takes_fps_from_the_container(tmp_path):
    reader = RawReader(write_raw(tmp_path / "src", SYN, video_cams=("front", "wrist"), meta_fps=False))
    assert reader.read("ep0001").fps == 10.0
    _check_round_trip(reader, tmp_path / "out", tol=8.0)
    # and the video itself is near the synthetic source (mp4v is lossy)
    got = np.stack(list(reader.read("ep0001").cameras["front"]))[..., ::-1].astype(int)
    assert np.abs(got - np.stack(list(SYN.read("ep0001").cameras["front"]))).mean() < 12


def test_zarr_round_trip_keeps_nested_array_names(tmp_path):
    idx = _check_round_trip(ZarrReader(write_zarr(tmp_path / "src", SYN)), tmp_path / "out", tol=8.0)
    assert idx.episode("ep0000").arrays["obs_state"].source == "obs/state"


def test_zarr_reads_each_key_once_per_episode(tmp_path, monkeypatch):
    import zarr

    reads: list[str] = []
    orig = zarr.Array.__getitem__
    monkeypatch.setattr(zarr.Array, "__getitem__", lambda self, sel: reads.append(self.path) or orig(self, sel))
    write_shards(ZarrReader(write_zarr(tmp_path / "src", SYN)), tmp_path / "out", WriteOptions(format="zarr"))
    assert sorted(reads) == sorted(f"{k}" for k in ["images/front", "images/wrist", "action", "keypoints",
                                                     "obs/state"] for _ in range(3))


def test_registry_detects_formats_and_readers_pickle(tmp_path):
    write_raw(tmp_path / "raw", SYN)
    write_zarr(tmp_path / "zarr", SYN)
    (tmp_path / "lr" / "meta").mkdir(parents=True)
    (tmp_path / "lr" / "meta" / "info.json").write_text("{}")
    assert [detect_format(tmp_path / n) for n in ("raw", "zarr", "lr")] == ["raw", "zarr", "lerobot"]
    for name in ("raw", "zarr"):
        reader = open_reader(tmp_path / name)
        assert isinstance(reader, EpisodeReader)
        assert pickle.loads(pickle.dumps(reader)).episode_ids() == ["ep0000", "ep0001", "ep0002"]


def test_missing_src_unknown_format_and_undetectable_src(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        open_reader(tmp_path / "nope")
    with pytest.raises(ValueError, match="unknown format 'hdf5'.*raw"):
        open_reader(tmp_path, "hdf5")
    with pytest.raises(ValueError, match="cannot tell the format.*--format"):
        open_reader(tmp_path)


def test_image_only_episode_without_fps_names_meta_json(tmp_path):
    reader = RawReader(write_raw(tmp_path / "src", SYN, meta_fps=False))
    with pytest.raises(EpisodeError, match=r"ep0000.*fps.*meta\.json"):
        reader.read("ep0000")
