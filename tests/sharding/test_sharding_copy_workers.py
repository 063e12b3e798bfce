"""`write_shards(codec="copy", workers=2)`: copy-only episodes run in a thread of the writer's process (no pool
started), an episode with frames to encode (an image feature) starts the pool for the rest, and the bytes equal a
1-worker write in every case, resumed and merged jobs included."""

from __future__ import annotations

import multiprocessing
import os
import threading

import pytest

from benchmarks.lerobot_data import make_lerobot
from episodepipes.sharding.episode import EpisodeError
from episodepipes.sharding.formats.lerobot import LeRobotReader
from episodepipes.sharding.merge import merge_jobs
from episodepipes.sharding.write import WriteOptions, write_shards

OPTS = WriteOptions(format="lerobot", shard_size=8_000, codec="copy", val_fraction=0.3, seed=1)


class _Crash(RuntimeError):
    pass


class _Reader(LeRobotReader):
    """A copying reader that logs, per read, its process and its live child processes to ``log``; ``bad`` ids
    raise ``error`` (once the file ``once`` is gone, if given)."""

    def __init__(self, root, log, bad=(), error=EpisodeError, **kw):  # noqa: ANN001, ANN003
        super().__init__(root, copy=True, **kw)
        self.log, self.bad, self.error = log, tuple(bad), error

    def __getstate__(self) -> dict:
        return dict(super().__getstate__(), log=self.log, bad=self.bad, error=self.error)

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["root"], state["log"], state["bad"], state["error"], tolerance_s=state["tolerance_s"])

    def read(self, episode_id: str):  # noqa: ANN201
        with open(self.log, "a") as f:
            f.write(f"{episode_id} {os.getpid()} {len(multiprocessing.active_children())}\n")
        if episode_id in self.bad:
            raise self.error(f"episode {episode_id!r}: broken on purpose")
        return super().read(episode_id)


def _files(d):
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file()}


def _reads(log):
    return [(e, int(pid), int(kids)) for e, pid, kids in (line.split() for line in log.read_text().splitlines())]


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("src")
    make_lerobot(root / "video", num_episodes=6, length=8, episodes_per_file=3, image_feature=False)
    make_lerobot(root / "image", num_episodes=6, length=8, episodes_per_file=3, image_feature=True)
    return root


def _one_and_two_workers(src, tmp_path):
    """Write ``src`` with 1 worker into ``one`` and with 2 into ``two``; the reads the 2-worker write made."""
    log = tmp_path / "reads.log"
    write_shards(_Reader(src, log), tmp_path / "one", OPTS, workers=1)
    log.unlink()
    write_shards(_Reader(src, log), tmp_path / "two", OPTS, workers=2)
    return _reads(log)


def test_a_copy_only_write_with_two_workers_starts_no_process_and_keeps_the_bytes(sources, tmp_path):
    reads = _one_and_two_workers(sources / "video", tmp_path)
    assert len(reads) == 6 and {(pid, kids) for _, pid, kids in reads} == {(os.getpid(), 0)}
    one = _files(tmp_path / "one")
    assert sum(n.endswith(".tar") for n in one) > 2 and one == _files(tmp_path / "two")
    assert not [t for t in threading.enumerate() if t.name.startswith("episodepipes-copy")]


def test_an_episode_with_frames_to_encode_starts_the_pool_for_the_rest(sources, tmp_path):
    reads = _one_and_two_workers(sources / "image", tmp_path)
    assert sorted(e for e, _, _ in reads) == sorted(LeRobotReader(sources / "image").episode_ids())
    here = [e for e, pid, _ in reads if pid == os.getpid()]
    # the first episode shows its image frames; those already started in the thread finish there, the rest go out
    assert 1 <= len(here) < 6 and any(pid != os.getpid() for _, pid, _ in reads)
    assert _files(tmp_path / "one") == _files(tmp_path / "two")


def test_a_bad_episode_in_the_thread_is_named_and_the_thread_ends(sources, tmp_path):
    ids = LeRobotReader(sources / "video").episode_ids()
    reader = _Reader(sources / "video", tmp_path / "reads.log", bad=(ids[1],))
    with pytest.raises(EpisodeError, match=f"episode {ids[1]!r}: broken on purpose"):
        write_shards(reader, tmp_path / "out", OPTS, workers=2)
    assert not [t for t in threading.enumerate() if t.name.startswith("episodepipes-copy")]
    res = write_shards(reader, tmp_path / "out", WriteOptions(**{**OPTS.__dict__, "skip_bad": True}), workers=2)
    assert res.resumed and [s["id"] for s in res.skipped] == [ids[1]] and res.episodes == 5


def test_an_interrupted_copy_job_resumes_and_merges_to_the_single_job_bytes(sources, tmp_path):
    log = tmp_path / "reads.log"
    ids = LeRobotReader(sources / "video").episode_ids()
    write_shards(_Reader(sources / "video", log), tmp_path / "one", OPTS, workers=1)
    write_shards(_Reader(sources / "video", log), tmp_path / "m", OPTS, num_jobs=2, job_index=0, workers=2)
    with pytest.raises(_Crash):  # not an input error: it stops the write, whose finished shards stay
        write_shards(_Reader(sources / "video", log, bad=(ids[5],), error=_Crash), tmp_path / "m", OPTS,
                     num_jobs=2, job_index=1, workers=2)
    assert not [t for t in threading.enumerate() if t.name.startswith("episodepipes-copy")]
    assert write_shards(_Reader(sources / "video", log), tmp_path / "m", OPTS, num_jobs=2, job_index=1,
                        workers=2).resumed
    merge_jobs(tmp_path / "m", repack=True)
    assert _files(tmp_path / "m") == _files(tmp_path / "one")
