import json

import pytest

from episodepipes.sharding.formats.synthetic import SyntheticReader
from episodepipes.sharding.merge import merge_jobs
from episodepipes.sharding.write import WriteOptions, write_shards

OPTS = WriteOptions(format="synthetic", shard_size=20_000)
KW = dict(length=3, height=32, width=40)


class _Renamed(SyntheticReader):
    """The same number of episodes as the reference, one of them under another id."""

    def episode_ids(self):
        return [*super().episode_ids()[:-1], "ep0099"]

    def read(self, episode_id):
        return super().read("ep0005" if episode_id == "ep0099" else episode_id)


@pytest.mark.parametrize("other, what", [
    (SyntheticReader(num_episodes=7, **KW), "7 source episodes vs 6"),
    (_Renamed(num_episodes=6, **KW), "different episode ids or options"),
])
def test_merge_refuses_a_job_written_from_another_source(tmp_path, other, what):
    # job 1 of a 7-episode source covers ep0003..ep0006, job 1 of 6 covers ep0003..ep0005: merged blindly,
    # the first would duplicate an episode or lose one
    write_shards(SyntheticReader(num_episodes=6, **KW), tmp_path / "m", OPTS, num_jobs=2, job_index=0)
    write_shards(other, tmp_path / "m", OPTS, num_jobs=2, job_index=1)
    with pytest.raises(ValueError, match=rf"job job-0001 was written from another source than job-0000 \(.*{what}\)"):
        merge_jobs(tmp_path / "m")
    assert not (tmp_path / "m" / "index.json").exists() and (tmp_path / "m" / "_jobs" / "job-0001").is_dir()


def test_each_job_records_its_episode_ids_and_source(tmp_path):
    reader = SyntheticReader(num_episodes=5, **KW)
    for i in range(2):
        write_shards(reader, tmp_path / "m", OPTS, num_jobs=2, job_index=i)
    jobs = [json.loads((tmp_path / "m" / "_jobs" / f"job-000{i}" / "index.json").read_text())["job"] for i in (0, 1)]
    assert [j["ids"] for j in jobs] == [["ep0000", "ep0001"], ["ep0002", "ep0003", "ep0004"]]
    assert jobs[0]["source"] == jobs[1]["source"] and len(jobs[0]["source"]) == 64


def test_merge_refuses_a_crafted_job_record(tmp_path):
    reader = SyntheticReader(num_episodes=4, **KW)
    for i in range(2):
        write_shards(reader, tmp_path / "m", OPTS, num_jobs=2, job_index=i)
    file = tmp_path / "m" / "_jobs" / "job-0001" / "index.json"
    data = json.loads(file.read_text())
    file.write_text(json.dumps({**data, "job": {**data["job"], "ids": ["ep0000", "ep0001"]}}))
    with pytest.raises(ValueError, match="episode 'ep0000' is in job job-0000 and job job-0001"):
        merge_jobs(tmp_path / "m")
    file.write_text(json.dumps({**data, "job": {**data["job"], "count": "2"}}))
    with pytest.raises(ValueError, match="job job-0001: .* no valid 'job' record"):
        merge_jobs(tmp_path / "m")
    file.write_text(json.dumps({k: v for k, v in data.items() if k != "job"}))
    with pytest.raises(ValueError, match="job job-0001: .* no valid 'job' record"):
        merge_jobs(tmp_path / "m")


def test_resuming_a_write_from_another_episode_list_is_refused(tmp_path):
    class _Stop(RuntimeError):
        pass

    class _Crash(SyntheticReader):
        def read(self, episode_id):
            if episode_id == "ep0004":
                raise _Stop
            return super().read(episode_id)

    with pytest.raises(_Stop):
        write_shards(_Crash(num_episodes=6, **KW), tmp_path / "o", OPTS)
    with pytest.raises(ValueError, match=r"other options \(differ: source\)"):
        write_shards(SyntheticReader(num_episodes=7, **KW), tmp_path / "o", OPTS)
