import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from episodepipes.sharding.write import progress

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = """
import resource, signal, sys
limit = int(sys.argv[1])
if limit:  # no mountable filesystem: a per-file size limit gives EFBIG instead of ENOSPC
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
from episodepipes.sharding.cli import main
from episodepipes.sharding.formats.readers import register_format
from episodepipes.sharding.formats.synthetic import SyntheticReader
register_format("syn", lambda root: SyntheticReader(num_episodes=10, length=20, height=96, width=128))
sys.exit(main(sys.argv[2:]))
"""


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MB tmpfs (as root); else None, and the test limits file sizes with RLIMIT_FSIZE instead."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    ok = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True).returncode
    yield mnt if ok == 0 else None
    if ok == 0:
        subprocess.run(["umount", "-l", str(mnt)], check=True)


def _run(limit, *argv):
    return subprocess.run([sys.executable, "-c", SCRIPT, str(limit), *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def _one_line_naming(res, out):
    assert res.returncode == 2, res.stderr
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr and "BufferError" not in res.stderr
    assert str(out) in res.stderr and "the disk is full" in res.stderr, res.stderr


def _files(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def _full_write_then_resume(tmp_path, small_disk, argv, *, size, limit, every_shard=True):
    """``write`` into an OUT whose disk fills mid-run (a ``size`` tmpfs, else files limited to ``limit`` bytes):
    one line naming OUT, nothing torn, and the same command resumes to the bytes of an uninterrupted run.
    ``every_shard``: with ``--save-every 0`` every shard under its final name is one the progress records; else
    the progress records a first few of them (those the last save wrote), and every one is whole."""
    ref = tmp_path / "ref"
    assert _run(0, "write", str(tmp_path), str(ref), *argv).returncode == 0
    out = (small_disk or tmp_path) / "out"
    if small_disk:
        subprocess.run(["mount", "-o", f"remount,size={size}", str(small_disk)], check=True)
    res = _run(0 if small_disk else limit, "write", str(tmp_path), str(out), *argv,
               *(["--save-every", "0"] if every_shard else []))
    _one_line_naming(res, out)
    assert "finished shards" in res.stderr and "re-run the same command to resume" in res.stderr
    # nothing written is torn: every shard under its final name is one the progress file records, whole
    prog = progress.read(out)  # the logged shards and episodes inline
    names = sorted(p.name for p in out.glob("shard-*.tar"))
    recorded = [s["name"] for s in prog["shards"]]
    assert (names == recorded if every_shard else names[:len(recorded)] == recorded)
    assert not (out / "index.json").exists()
    for name in names:  # whole, recorded or not: the bytes of the uninterrupted run's shard of that name
        assert (out / name).read_bytes() == (ref / name).read_bytes()
    assert len(names) >= (1 if small_disk else 0)  # the full disk came mid-run, after finished shards
    assert not (out / "_spool").exists()  # its files would keep holding the space the user must free
    for s in prog["shards"]:
        assert hashlib.sha256((out / s["name"]).read_bytes()).hexdigest() == s["sha256"]
    if small_disk:
        subprocess.run(["mount", "-o", "remount,size=20m", str(small_disk)], check=True)
    done = _run(0, "write", str(tmp_path), str(out), *argv)
    assert done.returncode == 0 and "resumed" in done.stdout, done.stderr
    assert _files(out) == _files(ref)


def test_full_disk_with_two_workers_is_one_line_and_resumes(tmp_path, small_disk):
    argv = ["--format", "syn", "--workers", "2", "--shard-size", "300kB"]
    _full_write_then_resume(tmp_path, small_disk, argv, size="2m", limit=200_000)


def test_full_disk_during_an_h264_write_is_one_line_and_resumes(tmp_path, small_disk):
    # the video encoder's output goes through the packed writer (chunks, GOPs): no torn chunk survives either
    argv = ["--format", "syn", "--codec", "h264", "--shard-size", "100kB"]
    _full_write_then_resume(tmp_path, small_disk, argv, size="300k", limit=60_000)


def test_full_disk_between_two_saves_keeps_whole_shards_and_resumes(tmp_path, small_disk):
    # the default --save-every: the shards since the last save have final names the progress may not record (the
    # save on the way out needs room too); the resume deletes and rewrites them
    argv = ["--format", "syn", "--workers", "2", "--shard-size", "300kB", "--save-every", "3600"]
    _full_write_then_resume(tmp_path, small_disk, argv, size="2m", limit=200_000, every_shard=False)


def test_full_disk_during_merge_names_out_keeps_the_jobs_and_resumes(tmp_path, small_disk):
    argv = ["--format", "syn", "--codec", "h264", "--shard-size", "300kB"]
    ref = tmp_path / "ref"
    assert _run(0, "write", str(tmp_path), str(ref), *argv).returncode == 0
    out = (small_disk or tmp_path) / "out"
    for j in range(2):
        job = ["--num-jobs", "2", "--job-index", str(j)]
        assert _run(0, "write", str(tmp_path), str(out), *argv, *job).returncode == 0
    if small_disk:  # room for the jobs and less than one merged shard
        used = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
        subprocess.run(["mount", "-o", f"remount,size={used // 1024 + 150}k", str(small_disk)], check=True)
    res = _run(0 if small_disk else 100_000, "merge", str(out), "--repack")
    _one_line_naming(res, out)
    assert "re-run the same merge" in res.stderr and not (out / "index.json").exists()
    assert sorted(p.name for p in (out / "_jobs").iterdir()) == ["job-0000", "job-0001"]
    if small_disk:
        subprocess.run(["mount", "-o", "remount,size=20m", str(small_disk)], check=True)
    assert _run(0, "merge", str(out), "--repack").returncode == 0
    assert _files(out) == _files(ref) and not (out / "_jobs").exists()


def test_a_shard_whose_progress_cannot_be_recorded_keeps_no_final_name(tmp_path):
    # the race CI hit: a worker renamed its shard into place, then the disk filled while saving _progress.json
    from episodepipes.sharding.formats.synthetic import SyntheticReader
    from episodepipes.sharding.write.encode import EncodeOptions, encode_episode
    from episodepipes.sharding.write.writer import ShardWriter

    def full_disk(writer):
        raise OSError(28, "No space left on device")

    reader = SyntheticReader(num_episodes=2, length=20, height=32, width=32)
    w = ShardWriter(tmp_path, shard_size=4096, options={}, on_shard=full_disk)
    with pytest.raises(OSError, match="No space"):
        for eid in reader.episode_ids():
            w.add(encode_episode(reader.read(eid), EncodeOptions()))
    assert w.shards == [] and not list(tmp_path.glob("shard-*.tar"))
    assert [p.name for p in tmp_path.glob("shard-*.tar.tmp")] == ["shard-000000.tar.tmp"]
