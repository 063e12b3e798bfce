"""With one worker the writer appends each episode in a thread while this process encodes the next one: the output,
the errors and the crash safety stay those of the plain loop."""

import hashlib
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from episodepipes.sharding.episode import EpisodeError
from episodepipes.sharding.formats.synthetic import SyntheticReader
from episodepipes.sharding.write import WriteOptions, progress, write_shards
from episodepipes.sharding.write.writer import ShardWriter

ROOT = Path(__file__).resolve().parents[2]
SYN = SyntheticReader(num_episodes=6, length=7, height=48, width=64, lengths=(7, 3, 9, 5, 8, 4))
OPTS = WriteOptions(format="synthetic", shard_size=35_000)  # shard 3 is the first above 40 kB


def _files(d):
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file()}


class _Threads(SyntheticReader):
    """Records the thread each episode is read (and so encoded) in."""

    seen: list

    def read(self, episode_id):
        self.seen.append(("read", episode_id, threading.current_thread().name))
        return super().read(episode_id)


def test_one_worker_appends_in_a_thread_beside_the_encoding_and_writes_the_same_bytes(tmp_path, monkeypatch):
    reader = _Threads(**{k: getattr(SYN, k) for k in ("num_episodes", "length", "height", "width", "lengths")})
    reader.seen = []
    add = ShardWriter.add_frames

    def spy(self, meta, *a, **k):
        reader.seen.append(("add", meta["id"], threading.current_thread().name))
        return add(self, meta, *a, **k)

    monkeypatch.setattr(ShardWriter, "add_frames", spy)
    write_shards(reader, tmp_path / "one", OPTS, workers=1)
    monkeypatch.undo()
    assert {t for what, _, t in reader.seen if what == "read"} == {threading.current_thread().name}
    assert {t for what, _, t in reader.seen if what == "add"} == {"episodepipes-write_0"}
    assert [e for what, e, _ in reader.seen if what == "add"] == SYN.episode_ids()  # in order
    write_shards(SYN, tmp_path / "two", OPTS, workers=2)
    assert len(_files(tmp_path / "one")) > 4 and _files(tmp_path / "one") == _files(tmp_path / "two")


class _BadThird(SyntheticReader):
    def read(self, episode_id):
        ep = super().read(episode_id)
        if episode_id == "ep0002":
            ep.arrays["state"] = ep.arrays["state"][:2]
        return ep


def test_a_bad_episode_taken_in_the_thread_is_raised_and_keeps_the_shards_before_it(tmp_path):
    reader = _BadThird(**{k: getattr(SYN, k) for k in ("num_episodes", "length", "height", "width", "lengths")})
    with pytest.raises(EpisodeError, match="ep0002"):
        write_shards(reader, tmp_path / "out", OPTS, workers=1)
    prog = progress.read(tmp_path / "out")  # the logged shards and episodes inline
    assert [e["id"] for e in prog["episodes"]] == ["ep0000"][:len(prog["episodes"])]
    for s in prog["shards"]:
        assert hashlib.sha256((tmp_path / "out" / s["name"]).read_bytes()).hexdigest() == s["sha256"]
    res = write_shards(reader, tmp_path / "out", WriteOptions(format="synthetic", shard_size=35_000, skip_bad=True))
    assert res.resumed and [s["id"] for s in res.skipped] == ["ep0002"]


SCRIPT = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a file past the limit fails with EFBIG, as on a full disk
limit = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
from episodepipes.sharding.formats.synthetic import SyntheticReader
from episodepipes.sharding.write import DiskFullError, WriteOptions, write_shards
reader = SyntheticReader(num_episodes=6, length=7, height=48, width=64, lengths=(7, 3, 9, 5, 8, 4))
try:
    write_shards(reader, sys.argv[2], WriteOptions(format="synthetic", shard_size=35_000), workers=1)
except DiskFullError as e:
    print(e)
    sys.exit(3)
"""


def test_a_full_disk_in_the_writing_thread_is_a_disk_full_error_and_resumes_to_the_same_bytes(tmp_path):
    ref, out = tmp_path / "ref", tmp_path / "out"
    write_shards(SYN, ref, OPTS, workers=1)
    sizes = [p.stat().st_size for p in sorted(ref.glob("shard-*.tar"))]
    assert max(sizes[:3]) < 40_000 < sizes[3]  # the limit lets three shards finish and stops the fourth
    res = subprocess.run([sys.executable, "-c", SCRIPT, "40000", str(out)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 3, res.stderr
    assert "the disk is full" in res.stdout and "re-run the same command to resume" in res.stdout
    prog = progress.read(out)
    assert sorted(p.name for p in out.glob("shard-*.tar")) == [s["name"] for s in prog["shards"]]
    assert len(prog["shards"]) == 3 and "after 3 finished shards" in res.stdout
    assert not (out / "index.json").exists()
    assert write_shards(SYN, out, OPTS, workers=1).resumed
    assert _files(out) == _files(ref)
