"""Packed codec shards through the writer's whole life: cut at chunk ends, resumed, merged, byte-identical."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from episodepipes.format import TAR_END
from episodepipes.index import EpisodeIndex
from episodepipes.pipes import video_pipe
from episodepipes.sharding.formats.synthetic import SyntheticReader
from episodepipes.sharding.merge import merge_jobs
from episodepipes.sharding.write import WriteOptions, write_shards

LENGTHS = (150, 20, 70, 9)  # ep0000 spans three chunks of 64 frames and more than one shard
SYN = SyntheticReader(num_episodes=4, height=32, width=48, lengths=LENGTHS, cameras=("front",))
OPTS = WriteOptions(format="synthetic", shard_size=15_000, codec="h264", gop=4)


def _files(d):
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file()}


class _Crash(RuntimeError):
    pass


class _CrashingReader(SyntheticReader):
    def read(self, episode_id):
        if episode_id == "ep0002":
            raise _Crash(episode_id)
        return super().read(episode_id)


def _crashing():
    return _CrashingReader(num_episodes=4, height=32, width=48, lengths=LENGTHS, cameras=("front",))


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    out = tmp_path_factory.mktemp("packed") / "ref"
    write_shards(SYN, out, OPTS)
    return out


def test_shards_are_cut_at_chunk_ends_only(ref):
    ix = EpisodeIndex.open(ref, verify=True)
    assert ix.meta["layout"] == "packed" and ix.problems(members=True) == []
    ep = ix.episode("ep0000")
    assert len(ep.segments) > 1
    entry = next(e for e in ix.data["episodes"] if e["id"] == "ep0000")
    for seg in entry["segments"]:  # every segment starts with a chunk's tar header and ends with its padding
        assert seg["heads"][0] >= 512 and (seg["end"] - seg["offsets"][0]) % 512 == 0
    for s in ix.shards:  # whole tar members, then the end-of-archive blocks
        assert (ref / s.name).read_bytes().endswith(TAR_END)


def test_an_interrupted_packed_write_resumes_mid_episode_to_identical_bytes(ref, tmp_path):
    with pytest.raises(_Crash):
        write_shards(_crashing(), tmp_path / "out", OPTS)
    assert "index.json" not in _files(tmp_path / "out")
    assert write_shards(SYN, tmp_path / "out", OPTS).resumed
    assert _files(tmp_path / "out") == _files(ref)


@pytest.mark.parametrize("num_jobs", [2, 3])
def test_merged_packed_jobs_are_byte_identical_to_a_single_job(ref, tmp_path, num_jobs):
    for i in range(num_jobs):
        write_shards(SYN, tmp_path / "multi", OPTS, num_jobs=num_jobs, job_index=i)
    merge_jobs(tmp_path / "multi", repack=True)
    assert _files(tmp_path / "multi") == _files(ref)


def test_an_interrupted_packed_job_resumes_and_merges_to_the_single_job_bytes(ref, tmp_path):
    write_shards(SYN, tmp_path / "m", OPTS, num_jobs=2, job_index=0)
    with pytest.raises(_Crash):  # ep0002 is in job 1's block
        write_shards(_crashing(), tmp_path / "m", OPTS, num_jobs=2, job_index=1)
    assert write_shards(SYN, tmp_path / "m", OPTS, num_jobs=2, job_index=1).resumed
    merge_jobs(tmp_path / "m", repack=True)
    assert _files(tmp_path / "m") == _files(ref)


def test_a_pinned_episode_over_chunks_and_shards_reads_each_record_once(ref):
    ix = EpisodeIndex.open(ref)
    ep = ix.episode("ep0000")
    pipe = video_pipe(ref, episodes=["ep0000"], batch_size=50, max_batches=3)
    got = [(int(f), bool(v)) for b in pipe for f, v in zip(b["frame"], b["valid"])]
    assert got == [(f, True) for f in range(150)]
    assert pipe.stats["bytes_read"] == int(np.sum(ix.tables.size[ep.rows.start:ep.rows.stop], dtype=np.int64))


def test_statistics_recomputed_from_packed_shards_equal_the_written_ones(ref, tmp_path):
    from episodepipes.sharding.recompute import add_stats

    out = shutil.copytree(ref, tmp_path / "s")
    before = (out / "index.json").read_bytes()
    add_stats(out)  # reads every array row back out of the packed records
    assert (out / "index.json").read_bytes() == before


def test_upgrade_adds_the_crc32_of_each_record_to_a_packed_index_without_them(ref, tmp_path):
    import json

    from episodepipes.format import COLUMNS
    from episodepipes.sharding.upgrade import upgrade

    out = shutil.copytree(ref, tmp_path / "s")
    d = json.loads((out / "index.json").read_text())
    d["crc32"] = False
    del d["columns"]["crc32"]
    (out / "index.json").write_text(json.dumps(d))
    (out / COLUMNS["crc32"][0]).unlink()
    ix = upgrade(out, crc=True)
    assert ix.meta["layout"] == "packed" and ix.problems(members=True) == []
    assert _files(out) == _files(ref)  # the same columns and index as the writer's
