"""The default merge adopts the jobs' shards by rename: no byte copied, the same frames as one job, crash-safe."""

import json
import os

import pytest
from fleetcheck import same_content

from episodepipes.errors import LockedError
from episodepipes.index import EpisodeIndex
from episodepipes.sharding.adopt import JOURNAL
from episodepipes.sharding.formats.synthetic import SyntheticReader
from episodepipes.sharding.merge import merge_jobs
from episodepipes.sharding.write import WriteOptions, write_shards
from episodepipes.sharding.write.lock import write_lock
from episodepipes.sharding.write.writer import write_index

SYN = SyntheticReader(num_episodes=7, length=9, height=16, width=16, lengths=(9, 5, 12, 7, 9, 3, 10))
OPTS = WriteOptions(format="synthetic", shard_size=3_000, val_fraction=0.3, seed=3)


def _jobs(out, k=3):
    for i in range(k):
        write_shards(SYN, out, OPTS, num_jobs=k, job_index=i)
    return sorted((out / "_jobs").glob("job-*/shard-*.tar"))


def _inodes(paths):
    return sorted(os.stat(p).st_ino for p in paths)


def test_in_place_merge_renames_every_job_shard_and_keeps_every_frame(tmp_path):
    write_shards(SYN, tmp_path / "one", OPTS)
    shards = _jobs(tmp_path / "m")
    inodes = _inodes(shards)
    merge_jobs(tmp_path / "m")
    merged = sorted((tmp_path / "m").glob("shard-*.tar"))
    assert _inodes(merged) == inodes  # the same files, renamed: not one byte copied
    assert [p.name for p in merged] == [f"shard-{i:06d}.tar" for i in range(len(shards))]
    assert same_content(tmp_path / "m", tmp_path / "one")
    assert not (tmp_path / "m" / "_jobs").exists() and not (tmp_path / "m" / JOURNAL).exists()
    assert EpisodeIndex.open(tmp_path / "m").meta["frames"] == sum(SYN.lengths)


def test_repack_is_still_byte_identical(tmp_path):
    write_shards(SYN, tmp_path / "one", OPTS)
    _jobs(tmp_path / "m")
    merge_jobs(tmp_path / "m", repack=True)
    files = {p.name: p.read_bytes() for p in (tmp_path / "m").iterdir() if p.is_file()}
    assert files == {p.name: p.read_bytes() for p in (tmp_path / "one").iterdir() if p.is_file()}


class _Killed(Exception):
    pass


def test_a_merge_killed_between_renames_finishes_when_re_run(tmp_path, monkeypatch):
    write_shards(SYN, tmp_path / "one", OPTS)
    shards = _jobs(tmp_path / "m")
    real, done = os.replace, []

    def replace(a, b):  # the merge dies after its third rename (the process killed there)
        if str(a).endswith(".tar") and "_jobs" in str(a):
            if len(done) == 3:
                raise _Killed
            done.append(a)
        real(a, b)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(_Killed):
        merge_jobs(tmp_path / "m")
    monkeypatch.setattr(os, "replace", real)
    assert (tmp_path / "m" / JOURNAL).exists() and not (tmp_path / "m" / "index.json").exists()
    assert len(list((tmp_path / "m").glob("shard-*.tar"))) == 3
    with pytest.raises(ValueError, match="interrupted in-place merge.*without --repack"):
        merge_jobs(tmp_path / "m", repack=True)  # a repack would clear the shards already moved
    merge_jobs(tmp_path / "m")
    assert len(list((tmp_path / "m").glob("shard-*.tar"))) == len(shards)
    assert same_content(tmp_path / "m", tmp_path / "one")


def test_a_merge_killed_after_its_index_cleans_up_when_re_run(tmp_path):
    _jobs(tmp_path / "m")
    merge_jobs(tmp_path / "m")
    before = (tmp_path / "m" / "index.json").read_bytes()
    (tmp_path / "m" / "_jobs" / "job-0001").mkdir(parents=True)  # left by a kill during the clean-up
    (tmp_path / "m" / JOURNAL).write_text("{}")
    merge_jobs(tmp_path / "m")
    assert not (tmp_path / "m" / "_jobs").exists() and not (tmp_path / "m" / JOURNAL).exists()
    assert (tmp_path / "m" / "index.json").read_bytes() == before


def test_a_journal_of_other_jobs_is_refused_and_nothing_moves(tmp_path):
    shards = _jobs(tmp_path / "m")
    (tmp_path / "m" / JOURNAL).write_text(json.dumps({"renames": [["_jobs/job-0000/x.tar", "shard-000000.tar", 1]]}))
    with pytest.raises(ValueError, match=f"{JOURNAL} records an interrupted merge of other job outputs"):
        merge_jobs(tmp_path / "m")
    assert all(p.exists() for p in shards)


def test_a_truncated_job_shard_is_refused_before_any_rename(tmp_path):
    shards = _jobs(tmp_path / "m")
    victim = shards[-1]
    os.truncate(victim, victim.stat().st_size - 512)
    with pytest.raises(ValueError, match=rf"job shard _jobs/{victim.parent.name}/{victim.name} has .* bytes, its index"
                                         " says .*--overwrite"):
        merge_jobs(tmp_path / "m")
    assert all(p.exists() for p in shards) and not (tmp_path / "m" / JOURNAL).exists()
    assert not list((tmp_path / "m").glob("shard-*.tar"))


def test_a_missing_job_is_named_and_nothing_moves(tmp_path):
    for i in (0, 2):
        write_shards(SYN, tmp_path / "m", OPTS, num_jobs=3, job_index=i)
    with pytest.raises(ValueError, match=r"jobs \[1\] of 3 are missing"):
        merge_jobs(tmp_path / "m")
    assert len(list((tmp_path / "m" / "_jobs").glob("job-*/shard-*.tar"))) > 2


def test_two_merges_at_once_the_second_is_refused_by_name(tmp_path):
    shards = _jobs(tmp_path / "m")
    with write_lock(tmp_path / "m"):  # a merge running (it holds OUT's write lock for its whole run)
        with pytest.raises(LockedError, match=f"{tmp_path / 'm'} is being written by pid {os.getpid()}"):
            merge_jobs(tmp_path / "m")
    assert all(p.exists() for p in shards)


def test_a_job_written_with_other_options_is_refused_by_name(tmp_path):
    for i in range(2):
        write_shards(SYN, tmp_path / "m", OPTS, num_jobs=3, job_index=i)
    write_shards(SYN, tmp_path / "m", WriteOptions(**{**OPTS.__dict__, "jpeg_quality": 50}), num_jobs=3,
                 job_index=2)
    with pytest.raises(ValueError, match="job job-0002 was written with other options than job-0000"):
        merge_jobs(tmp_path / "m")


def test_a_version_1_job_is_refused_before_any_rename(tmp_path):
    shards = _jobs(tmp_path / "m", 2)
    job = tmp_path / "m" / "_jobs" / "job-0001"
    index = EpisodeIndex.open(job)
    data = index.data  # the v1 layout of the same index, written as an older episodepipes wrote it
    extra = {k: v for k, v in index.meta.items() if k in ("job", "stats_file", "skipped")}
    write_index(job, data["shards"], data["episodes"], data["options"], extra=extra, version=1)
    with pytest.raises(ValueError, match=r"jobs \['job-0001'\] have version-1 indexes.*upgrade.*--repack"):
        merge_jobs(tmp_path / "m")
    assert all(p.exists() for p in shards) and not (tmp_path / "m" / JOURNAL).exists()
    merge_jobs(tmp_path / "m", repack=True)
