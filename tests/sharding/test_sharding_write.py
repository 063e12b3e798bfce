import shutil

import numpy as np
import pytest
import webdataset as wds
from helpers import write_raw, write_zarr

from episodepipes.pipes import EpisodeIndex
from episodepipes.sharding.episode import EpisodeError
from episodepipes.sharding.formats.raw import RawReader
from episodepipes.sharding.formats.synthetic import SyntheticReader
from episodepipes.sharding.formats.zarr_reader import ZarrReader
from episodepipes.sharding.merge import merge_jobs
from episodepipes.sharding.write import WriteOptions, write_shards

SYN = SyntheticReader(num_episodes=7, length=9, height=64, width=80, lengths=(9, 5, 12, 7, 9, 3, 10))
OPTS = WriteOptions(format="synthetic", shard_size=30_000, val_fraction=0.3, seed=3)


def _files(d):
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file()}


def test_output_is_byte_identical_across_runs_and_worker_counts(tmp_path):
    write_shards(SYN, tmp_path / "a", OPTS, workers=1)
    write_shards(SYN, tmp_path / "b", OPTS, workers=2)
    a = _files(tmp_path / "a")
    assert len(a) > 5 and a == _files(tmp_path / "b")
    idx = EpisodeIndex.open(tmp_path / "a", verify=True)
    # every synthetic episode has a split of its own (i % 3 == 2 is val), which wins over --val-fraction
    assert sorted(e.id for e in idx.split("val")) == ["ep0002", "ep0005"]
    urls = [str(tmp_path / "a" / s.name) for s in idx.shards]
    assert sum(1 for _ in wds.WebDataset(urls, shardshuffle=False)) == sum(SYN.lengths)


class _Crash(RuntimeError):
    pass


class _CrashingReader(SyntheticReader):
    """Fails (like a killed process, not like bad input) when reading one episode."""

    def read(self, episode_id):
        if episode_id == "ep0004":
            raise _Crash(episode_id)
        return super().read(episode_id)


def test_interrupted_write_resumes_to_identical_bytes(tmp_path):
    write_shards(SYN, tmp_path / "ref", OPTS)
    crashing = _CrashingReader(**{k: getattr(SYN, k) for k in ("num_episodes", "length", "height", "width",
                                                                "lengths")})
    with pytest.raises(_Crash):
        write_shards(crashing, tmp_path / "out", OPTS)
    left = _files(tmp_path / "out")
    assert "index.json" not in left and "_progress.json" in left and "shard-000001.tar" in left
    with pytest.raises(FileNotFoundError, match="unfinished write"):  # a half-written output is not finished
        EpisodeIndex.open(tmp_path / "out")
    with pytest.raises(ValueError, match="other options.*jpeg_quality.*--overwrite"):
        write_shards(SYN, tmp_path / "out", WriteOptions(**{**OPTS.__dict__, "jpeg_quality": 50}))
    assert write_shards(SYN, tmp_path / "out", OPTS).resumed
    assert _files(tmp_path / "out") == _files(tmp_path / "ref")


def test_finished_output_is_not_overwritten_without_overwrite(tmp_path):
    write_shards(SYN, tmp_path / "o", OPTS)
    with pytest.raises(FileExistsError, match="--overwrite"):
        write_shards(SYN, tmp_path / "o", OPTS)
    write_shards(SyntheticReader(num_episodes=2, length=3), tmp_path / "o", OPTS, overwrite=True)
    assert len(EpisodeIndex.open(tmp_path / "o").episodes) == 2 and not (tmp_path / "o" / "shard-000009.tar").exists()


@pytest.mark.parametrize("num_jobs", [2, 3])
def test_merged_jobs_are_byte_identical_to_a_single_job(tmp_path, num_jobs):
    write_shards(SYN, tmp_path / "one", OPTS)
    for i in reversed(range(num_jobs)):  # order of job completion does not matter
        write_shards(SYN, tmp_path / "multi", OPTS, num_jobs=num_jobs, job_index=i, workers=2)
    with pytest.raises(FileNotFoundError, match="unfinished"):
        EpisodeIndex.open(tmp_path / "multi")
    merge_jobs(tmp_path / "multi", repack=True)
    assert _files(tmp_path / "multi") == _files(tmp_path / "one")
    assert not (tmp_path / "multi" / "_jobs").exists()


def test_merge_names_a_missing_or_unfinished_job(tmp_path):
    write_shards(SYN, tmp_path / "m", OPTS, num_jobs=3, job_index=0)
    with pytest.raises(ValueError, match=r"jobs \[1, 2\] of 3 are missing"):
        merge_jobs(tmp_path / "m")
    write_shards(SYN, tmp_path / "m", OPTS, num_jobs=3, job_index=1)
    write_shards(SYN, tmp_path / "m", OPTS, num_jobs=3, job_index=2)
    (tmp_path / "m" / "_jobs" / "job-0001" / "index.json").unlink()
    with pytest.raises(ValueError, match="job job-0001 is unfinished.*re-run"):
        merge_jobs(tmp_path / "m")


def _corrupt_png(src):
    (src / "ep0001" / "front" / "000003.png").write_bytes(b"not a png")
    return "000003.png"


def _corrupt_mp4(src):
    shutil.rmtree(src / "ep0001" / "wrist")
    (src / "ep0001" / "wrist.mp4").write_bytes(b"\0\0\0\x18ftypmp42" + b"garbage" * 50)
    return "wrist.mp4"


def _short_arrays(src):
    arrays = dict(np.load(src / "ep0001" / "arrays.npz"))
    np.savez(src / "ep0001" / "arrays.npz", **{**arrays, "action": arrays["action"][:-2]})
    return "'action' has 3 steps but the cameras have 5 frames"


def _camera_lengths(src):
    (src / "ep0001" / "wrist" / "000004.png").unlink()
    return "different frame counts"


def _frame_size_changes(src):
    import cv2

    cv2.imwrite(str(src / "ep0001" / "front" / "000002.png"), np.zeros((16, 20, 3), np.uint8))
    return "frame 2 is (16, 20), frame 0 was (32, 40)"


def _bad_npz(src):
    (src / "ep0001" / "arrays.npz").write_bytes(b"PK garbage")
    return "arrays.npz"


@pytest.mark.parametrize("corrupt", [_corrupt_png, _corrupt_mp4, _short_arrays, _camera_lengths,
                                     _frame_size_changes, _bad_npz])
def test_bad_episode_is_named_or_skipped(tmp_path, corrupt):
    src = write_raw(tmp_path / "src", SyntheticReader(num_episodes=3, length=9, lengths=(4, 5, 6),
                                                      height=32, width=40))
    expected = corrupt(src)
    with pytest.raises(EpisodeError, match="ep0001") as e:
        write_shards(RawReader(src), tmp_path / "out", WriteOptions(format="raw"))
    assert expected in str(e.value)
    res = write_shards(RawReader(src), tmp_path / "out", WriteOptions(format="raw", skip_bad=True), overwrite=True)
    assert [s["id"] for s in res.skipped] == ["ep0001"] and expected in res.skipped[0]["error"]
    index = EpisodeIndex.open(tmp_path / "out")
    assert [e.id for e in index.episodes] == ["ep0000", "ep0002"] and index.meta["skipped"] == res.skipped


def test_empty_episode_is_named(tmp_path):
    src = write_zarr(tmp_path / "src", SyntheticReader(num_episodes=2, length=3, height=32, width=40))
    import zarr

    g = zarr.open_group(str(src / "ep0001.zarr"), mode="r+")
    for cam in ("front", "wrist"):
        g.create_array(f"images/{cam}", shape=(0, 32, 40, 3), dtype="uint8", overwrite=True)
    for k in ("action", "keypoints"):
        g.create_array(k, shape=(0, 7), dtype="float32", overwrite=True)
    with pytest.raises(EpisodeError, match="ep0001.*empty episode"):
        write_shards(ZarrReader(src), tmp_path / "out", WriteOptions(format="zarr"))


def test_an_interrupted_job_resumes_and_still_merges_to_the_single_job_bytes(tmp_path):
    write_shards(SYN, tmp_path / "one", OPTS)
    crashing = _CrashingReader(**{k: getattr(SYN, k) for k in ("num_episodes", "length", "height", "width",
                                                                "lengths")})
    write_shards(SYN, tmp_path / "m", OPTS, num_jobs=2, job_index=0)
    with pytest.raises(_Crash):  # ep0004 is in job 1's block (episodes 3..6)
        write_shards(crashing, tmp_path / "m", OPTS, num_jobs=2, job_index=1, workers=2)
    assert write_shards(SYN, tmp_path / "m", OPTS, num_jobs=2, job_index=1, workers=2).resumed
    merge_jobs(tmp_path / "m", repack=True)
    assert _files(tmp_path / "m") == _files(tmp_path / "one")


class _ThreadsReader(SyntheticReader):
    """Records each encoder's OpenCV thread count as the episode's prompt."""

    def read(self, episode_id):
        import cv2

        ep = super().read(episode_id)
        ep.prompt = str(cv2.getNumThreads())
        return ep


def test_forked_encoders_get_one_opencv_thread_without_setting_it_in_the_child(tmp_path):
    # cv2.setNumThreads in a forked child can wait forever on the parent's pool: the parent sets it
    # around the fork instead, and restores its own count
    import cv2

    before = cv2.getNumThreads()
    reader = _ThreadsReader(num_episodes=3, length=2, height=16, width=16)
    write_shards(reader, tmp_path / "s", WriteOptions(format="synthetic"), workers=2)
    assert {e.prompt for e in EpisodeIndex.open(tmp_path / "s").episodes} == {"1"}
    assert cv2.getNumThreads() == before


def test_merge_refuses_a_damaged_job_shard(tmp_path):
    for i in range(2):
        write_shards(SYN, tmp_path / "m", OPTS, num_jobs=2, job_index=i)
    shard = sorted((tmp_path / "m" / "_jobs" / "job-0001").glob("shard-*.tar"))[0]
    blob = bytearray(shard.read_bytes())
    blob[700] ^= 0xFF
    shard.write_bytes(bytes(blob))
    with pytest.raises(ValueError, match=rf"job job-0001: .*{shard.name}: sha256 mismatch.*--overwrite"):
        merge_jobs(tmp_path / "m", repack=True)  # the in-place merge checks sizes only: `verify` reads the bytes
    assert not (tmp_path / "m" / "index.json").exists()
