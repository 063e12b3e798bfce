"""Hostile job outputs at merge: a job index whose ``num_jobs`` is a memory bomb, job statistics side files that are
consistent in themselves but count another job's steps, or that are FIFOs; locally and from an S3 OUT. Each is
refused in one line naming the job and the fix, before anything is merged."""

import json
import os
import shutil

import pytest

from episodepipes.index import EpisodeIndex
from episodepipes.normstats import sidefile as statsfile
from episodepipes.sharding import cli
from episodepipes.sharding.formats.synthetic import SyntheticReader
from episodepipes.sharding.merge import merge_jobs
from episodepipes.sharding.write import WriteOptions, write_shards

SYN = SyntheticReader(num_episodes=7, length=9, height=16, width=24, lengths=(9, 5, 12, 7, 9, 3, 10))
OPTS = WriteOptions(format="synthetic", shard_size=20_000)
BUCKET = "hostile-merge"


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    out = tmp_path_factory.mktemp("jobs") / "out"
    for j in range(2):
        write_shards(SYN, out, OPTS, num_jobs=2, job_index=j)
    return out


@pytest.fixture
def out(jobs, tmp_path):
    shutil.copytree(jobs, tmp_path / "out")
    return tmp_path / "out"


def _job(out, j):
    return out / "_jobs" / f"job-{j:04d}"


def _edit_index(d, edit):
    data = json.loads((d / "index.json").read_text())
    edit(data)
    (d / "index.json").write_text(json.dumps(data))


def _swap_stats(out):
    """Each job's side file becomes the other's, and its index vouches for it: every sha256 matches."""
    a, b = (_job(out, j) / statsfile.NAME for j in (0, 1))
    ra, rb = a.read_bytes(), b.read_bytes()
    for d, raw in ((_job(out, 0), rb), (_job(out, 1), ra)):
        (d / statsfile.NAME).write_bytes(raw)
        _edit_index(d, lambda data, raw=raw: data.update(statsfile.descriptor(raw)))


def test_a_job_claiming_ten_billion_jobs_is_refused_without_counting_to_it(out, capsys):
    _edit_index(_job(out, 0), lambda data: data["job"].update(num_jobs=10**10))
    with pytest.raises(ValueError, match=r"_jobs: jobs \[2, 3, .*, 11\] and more of 10000000000 are missing; run them "
                                         "with --job-index$"):
        merge_jobs(out)
    assert cli.main(["merge", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "10000000000" in err
    assert (out / "_jobs").is_dir() and not (out / "index.json").exists()


def test_job_statistics_of_another_job_are_refused_by_name(out, capsys):
    _swap_stats(out)
    with pytest.raises(ValueError, match=r"^job job-0000: .*job-0000/index.stats.bin: stats\['\w+'\]\['\w+'\] count="
                                         r"\d+, but the index's \w+ episodes with '\w+' have \d+ steps; .*re-run that "
                                         "job with --overwrite$"):
        merge_jobs(out)
    assert not (out / "index.json").exists() and (out / "_jobs").is_dir()


def test_a_job_statistics_fifo_is_refused_without_blocking(out):
    side = _job(out, 1) / statsfile.NAME
    side.unlink()
    os.mkfifo(side)
    with pytest.raises(ValueError, match=rf"^job job-0001: .*{side} is not a regular file .*re-run that job with "
                                         "--overwrite$"):
        merge_jobs(out)


def test_remote_job_statistics_of_another_job_are_refused_before_merging(out, moto, proxy, tmp_path):
    """A remote job is opened without reading its side file (its frames are crc32-checked as they are copied);
    its statistics are still counted against its episodes before any merged object is written."""
    _swap_stats(out)
    for j in (0, 1):
        moto.upload_dir(_job(out, j), BUCKET, f"swapped/_jobs/job-{j:04d}")
    url = f"s3://{BUCKET}/swapped"
    with pytest.raises(ValueError, match=r"^job job-0000: .*index.stats.bin: stats\['\w+'\]\['\w+'\] count=\d+, but "
                                         r"the index's \w+ episodes .*re-run that job with --overwrite$"):
        merge_jobs(url, staging=tmp_path / "stage")
    with pytest.raises(FileNotFoundError):
        EpisodeIndex.open(url)  # nothing merged


def test_untouched_jobs_merge(out, tmp_path):
    single = tmp_path / "single"
    write_shards(SYN, single, OPTS)
    merge_jobs(out, repack=True)
    assert (out / "index.json").read_bytes() == (single / "index.json").read_bytes()


def test_a_packed_job_whose_chunk_member_points_into_the_episode_before_is_refused_naming_the_job(tmp_path):
    """ep0001's chunk member set to ep0000's last chunk (the tar headers are 512-byte aligned): the column check at
    the job index's open refuses it, naming the job, the episode and the column."""
    import hashlib

    import numpy as np

    from episodepipes.format import COLUMNS

    reader = SyntheticReader(num_episodes=4, height=32, width=48, lengths=(20, 9, 12, 7))
    opts = WriteOptions(format="synthetic", shard_size=1 << 20, codec="h264", gop=4)
    out = tmp_path / "out"
    for j in range(2):
        write_shards(reader, out, opts, num_jobs=2, job_index=j)
    job = _job(out, 0)
    ix = EpisodeIndex.open(job)
    col = job / COLUMNS["member"][0]
    member = np.load(col).copy()
    rows = ix.episode("ep0001").rows
    first = rows.start + np.flatnonzero(member[rows] == member[rows.start])
    member[first] = member[ix.episode("ep0000").rows][-1]
    np.save(col, member, allow_pickle=False)
    _edit_index(job, lambda data: data["columns"]["member"].update(sha256=hashlib.sha256(col.read_bytes()).hexdigest()))
    with pytest.raises(ValueError, match=r"^job job-0000: .*job-0000/index.json is damaged: frame row 20 \(episode "
                                         r"'ep0001', frame 0\): its member: .*; re-run that job with --overwrite$"):
        merge_jobs(out)
    assert (out / "_jobs").is_dir() and not (out / "index.json").exists()
