"""The overlay video writer against other runs sharing its folder, planted links, a full disk and odd frame rates.

Every case uses real files and real processes: a second run is a second process, a full disk is a small tmpfs (as
root) or a per-file size limit (RLIMIT_FSIZE, which gives EFBIG) in a subprocess, the DDP case two real ranks.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import pytest
from ddp.app import EpisodeData, TinyModel
from helpers import make_shards, run_script_ranks

from episodepipes.errors import EpisodeError
from episodepipes.lightning_glue import AtomicMp4, OverlayVideoWriter
from episodepipes.lightning_glue.fps import MAX_FPS, MIN_FPS
from episodepipes.lightning_glue.partials import PARTIAL, host_id, partial_path, run_token
from episodepipes.lightning_glue.video_writer import read_rgb
from episodepipes.safefile import UnsafePathError

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "tests" / "ddp" / "app.py"
FPS, LENGTH = 7.5, 12


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return str(make_shards(tmp_path_factory.mktemp("hv") / "s", num_episodes=6, length=LENGTH, height=32, width=48,
                           fps=FPS))


def _trainer(callbacks, **kw):
    kw = {"max_epochs": 1, "num_sanity_val_steps": 0, "logger": False, **kw}
    return pl.Trainer(accelerator="cpu", devices=1, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, callbacks=callbacks, **kw)


def _validate(root, dirpath, pinned=("ep0000",)):
    writer = OverlayVideoWriter(dirpath, every_n_passes=1)
    _trainer([writer]).validate(TinyModel(), datamodule=EpisodeData(root, pinned=list(pinned)), verbose=False)
    return writer


# -- item 10: a run owns only its own files ------------------------------------------------------------------------
OTHER_RUN = """
import sys, numpy as np
from episodepipes.lightning_glue import AtomicMp4
f = AtomicMp4(sys.argv[1], fps=5)
for i in range(3):
    f.write(np.full((24, 32, 3), 40 * i, np.uint8))
print(f.tmp, flush=True)
sys.stdin.readline()  # the other run's setup happens here
print(f.close(), flush=True)
"""


def test_a_second_runs_setup_leaves_a_running_runs_partial_video_alone(tmp_path):
    path = tmp_path / "pinned" / "ep0003_step00000010.mp4"  # the first run pins another episode
    first = subprocess.Popen([sys.executable, "-c", OTHER_RUN, str(path)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    tmp = Path(first.stdout.readline().strip())
    assert tmp.exists()
    OverlayVideoWriter(tmp_path).setup(_trainer([]), TinyModel(), "fit")  # the second run starts
    out, err = first.communicate("go\n", timeout=60)
    assert first.returncode == 0, err  # it used to die here with FileNotFoundError, its partial file gone
    assert out.strip() == str(path) and len(read_rgb(path)) == 3 and not tmp.exists()


def test_only_provably_abandoned_partial_files_are_removed(tmp_path):
    folder = tmp_path / "pinned"
    folder.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)  # a process that has exited: its pid is not alive on this host
    other_host = "0" * 8 if host_id() != "0" * 8 else "1" * 8
    kept = [f".ep0.run-{other_host}-{dead_pid}-00000000{PARTIAL}",  # another host: its pids mean nothing here
            f".ep1.run-{host_id()}-{os.getpid()}-00000000{PARTIAL}",  # a live process (this one)
            f".ep2{PARTIAL}"]  # not a name this version writes: not provably anyone's
    gone = f".ep3.run-{host_id()}-{dead_pid}-00000000{PARTIAL}"
    for name in [*kept, gone]:
        (folder / name).write_bytes(b"partial")
    OverlayVideoWriter(tmp_path).setup(_trainer([]), TinyModel(), "fit")
    assert sorted(p.name for p in folder.iterdir()) == sorted(kept)


def test_a_locked_partial_file_is_left_alone_even_when_its_pid_looks_dead(tmp_path):
    # a live run in another pid namespace under the same host name: its pid is unknown here, its lock is not
    import fcntl

    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout)
    p = tmp_path / f".ep.run-{host_id()}-{dead}-00000000{PARTIAL}"
    p.write_bytes(b"partial")
    with open(p, "rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        OverlayVideoWriter(tmp_path).setup(_trainer([]), TinyModel(), "fit")
        assert p.exists()


def test_a_second_run_at_the_same_step_keeps_the_first_runs_video_and_writes_a_version(root, tmp_path, caplog):
    first = _validate(root, tmp_path)
    (video,) = first.written
    before = video.read_bytes()
    with caplog.at_level(logging.WARNING, logger="episodepipes"):
        second = _validate(root, tmp_path)
    assert video.read_bytes() == before  # it used to be replaced silently
    assert [p.name for p in second.written] == ["ep0000_step00000000_validate-v1.mp4"]
    assert len(read_rgb(second.written[0])) == LENGTH
    assert any(str(video) in r.getMessage() and "already exists" in r.getMessage() for r in caplog.records)
    assert [p.name for p in _validate(root, tmp_path).written] == ["ep0000_step00000000_validate-v2.mp4"]


# -- planted links: nothing is written outside the video folder ----------------------------------------------------
def test_a_link_planted_at_the_final_name_is_kept_and_its_target_untouched(root, tmp_path):
    victim = tmp_path / "victim.mp4"
    victim.write_bytes(b"not yours")
    folder = tmp_path / "v" / "pinned"
    folder.mkdir(parents=True)
    link = folder / "ep0000_step00000000_validate.mp4"
    link.symlink_to(victim)
    writer = _validate(root, tmp_path / "v")
    assert link.is_symlink() and victim.read_bytes() == b"not yours"  # the link used to be replaced
    assert [p.name for p in writer.written] == ["ep0000_step00000000_validate-v1.mp4"]


def test_a_link_planted_in_place_of_the_video_folder_is_refused_by_name(root, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "v").mkdir()
    (tmp_path / "v" / "pinned").symlink_to(outside)
    with pytest.raises(UnsafePathError, match=r"v/pinned is a symlink"):
        _validate(root, tmp_path / "v")
    assert list(outside.iterdir()) == []  # videos used to be written through the link


def test_a_link_planted_at_a_partial_name_is_refused_and_never_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"not yours")
    path = tmp_path / "ep_step1.mp4"
    (tmp_path / f".{path.stem}{PARTIAL}").symlink_to(victim)  # the name every run used to write to
    with AtomicMp4(path, fps=5) as f:
        f.write(np.zeros((16, 16, 3), np.uint8))
    assert victim.read_bytes() == b"not yours" and len(read_rgb(path)) == 1
    data = path.read_bytes()  # PyAV wrote through the created descriptor, and its faststart pass found it again
    assert data.index(b"moov") < data.index(b"mdat")
    token = run_token()
    partial_path(path, token).symlink_to(victim)  # even a link at this run's own name (a guessed token)
    f = AtomicMp4(path, fps=5, owner=token)
    with pytest.raises(UnsafePathError, match="is a symlink"):
        f.write(np.zeros((16, 16, 3), np.uint8))
    f.discard()
    assert victim.read_bytes() == b"not yours" and partial_path(path, token).is_symlink()


# -- item 13: frame rates an mp4 stores ---------------------------------------------------------------------------
@pytest.mark.parametrize("fps", [1e-3, 5e-3])
def test_an_fps_no_mp4_stores_is_refused_at_validation_start_naming_loader_episode_and_fps(tmp_path, fps):
    # an index takes 0.001..1000 frames per second; mp4v stores no rate under 0.01, so such an index is refused
    # by the video writer's check at validation start, before any pass renders
    root = make_shards(tmp_path / "s", num_episodes=3, length=4, height=16, width=16, fps=fps)
    writer = OverlayVideoWriter(tmp_path / "v", every_n_passes=100)  # no pass renders: caught before any does
    msg = rf"episode 'ep0000' of video loader 'pinned' .* has fps={re.escape(repr(fps))}, which is outside 0.01..10000"
    with pytest.raises(ValueError, match=msg):
        _trainer([writer]).fit(TinyModel(), datamodule=EpisodeData(str(root), pinned=["ep0001"]))
    with pytest.raises(ValueError, match=rf"fps={re.escape(repr(fps))} is outside"):
        AtomicMp4(tmp_path / "a.mp4", fps=fps)


def test_an_fps_of_1e308_is_refused_by_the_writer_and_by_the_mp4_writer(tmp_path):
    with pytest.raises(EpisodeError, match=r"fps=1e\+308 is not a positive, finite number"):
        make_shards(tmp_path / "s", num_episodes=1, length=4, height=16, width=16, fps=1e308)
    with pytest.raises(ValueError, match=r"fps=1e\+308 is outside"):
        AtomicMp4(tmp_path / "a.mp4", fps=1e308)  # used to die with OverflowError at the first frame


@pytest.mark.parametrize("codec", ["h264", "mp4v"])
def test_the_fps_range_is_what_both_encoders_store_and_beyond_it_is_refused(tmp_path, codec):
    import av

    for fps in (MIN_FPS, MAX_FPS):  # the bound is not arbitrary: both ends are stored exactly by either encoder
        with AtomicMp4(tmp_path / f"{fps}.mp4", fps=fps, codec=codec) as f:
            for i in range(3):
                f.write(np.full((16, 16, 3), 60 * i, np.uint8))
        with av.open(str(tmp_path / f"{fps}.mp4")) as c:
            s = c.streams.video[0]
            assert float(s.average_rate) == pytest.approx(fps) and len(list(c.decode(s))) == 3
    for fps in (MIN_FPS / 2, MAX_FPS * 2, 2.0**31):  # h264 took the first two; 2**31 died with OverflowError
        with pytest.raises(ValueError, match=rf"fps={re.escape(repr(fps))} is outside 0.01..10000"):
            AtomicMp4(tmp_path / "b.mp4", fps=fps, codec=codec)


# -- item 12: a full disk under the video folder --------------------------------------------------------------------
FULL = """
import json, logging, os, resource, signal, sys
limit, root, dirpath, filler = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
if limit:  # no mountable filesystem: a per-file size limit gives EFBIG instead of ENOSPC
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
import lightning.pytorch as pl
from ddp.app import EpisodeData, TinyModel
from episodepipes.lightning_glue import OverlayVideoWriter
errors = []
class Keep(logging.Handler):
    def emit(self, r):
        if r.levelno >= logging.ERROR:
            errors.append(r.getMessage())
logging.getLogger("episodepipes").addHandler(Keep())
def run():
    w = OverlayVideoWriter(dirpath, every_n_passes=1)
    t = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                   enable_model_summary=False, callbacks=[w])
    t.validate(TinyModel(), datamodule=EpisodeData(root, pinned=["ep0000", "ep0003"]), verbose=False)
    fds = [os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
           if os.path.exists(f"/proc/self/fd/{fd}")]
    files = sorted(str(p.relative_to(dirpath)) for p in __import__("pathlib").Path(dirpath).rglob("*"))
    return {"written": [str(p) for p in w.written], "failed": w.failed_steps, "files": files,
            "fds": [f for f in fds if f.startswith(dirpath)]}
first = run()
if os.path.exists(filler):
    os.unlink(filler)  # space freed: the next render pass writes again
print(json.dumps({"first": first, "second": run(), "errors": errors}))
"""


@pytest.fixture
def full_disk(tmp_path):
    """A 512 kB tmpfs filled to the last block (as root), or None: the subprocess then limits file sizes."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    ok = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mnt)],
                        capture_output=True).returncode == 0
    try:
        if ok:
            fd = os.open(mnt / "filler", os.O_WRONLY | os.O_CREAT)
            try:
                with pytest.raises(OSError, match="No space"):
                    while True:
                        os.write(fd, b"\0" * 4096)
            finally:
                os.close(fd)
        yield mnt, ok
    finally:
        if ok:
            subprocess.run(["umount", "-l", str(mnt)], check=True)


def test_a_full_disk_drops_the_pass_closes_every_video_and_training_goes_on(root, full_disk):
    mnt, mounted = full_disk
    dirpath = mnt / "videos" if mounted else mnt
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    res = subprocess.run([sys.executable, "-c", FULL, "0" if mounted else "2000", root, str(dirpath),
                          str(mnt / "filler")],
                         capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]  # it used to die with a raw OSError [Errno 28]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    first = got["first"]
    assert first["written"] == [] and first["failed"] == [0]
    assert [f for f in first["files"] if f.endswith(".mp4")] == []  # no partial file of either video stays
    assert first["fds"] == []  # and no descriptor: the second open video was closed too
    (line,) = got["errors"][:1]
    assert "\n" not in line and str(dirpath / "pinned") in line and "Free space there" in line
    assert "training goes on" in line
    if mounted:  # space freed between the passes: the next one writes both videos
        assert len(got["second"]["written"]) == 2 and got["second"]["failed"] == [] and len(got["errors"]) == 1


def test_a_full_disk_during_ddp_rendering_hangs_no_rank_and_both_finish(root, full_disk, tmp_path):
    mnt, mounted = full_disk
    out = tmp_path / "out"
    out.mkdir()
    (out / "videos").symlink_to(mnt)  # the user's dirpath may be a link to another disk; rank 0 writes there
    # without root, a per-file size limit stands in for the full disk (tests/ddp/fsize_app.py)
    app, env = (APP, None) if mounted else (APP.with_name("fsize_app.py"), {"EPISODEPIPES_TEST_FSIZE": "4096"})
    exits = run_script_ranks(app, root, str(out), "--epochs", "2", "--every", "1", "--timeout", "60", nprocs=2,
                             out=out, timeout=150, env_extra=env)
    assert [e.returncode for e in exits] == [0, 0], [e.tail() for e in exits]  # rank 0 used to die, rank 1 wait
    r0, r1 = (json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1))
    assert r0["written"] == [] and r0["fit"] == r1["fit"] and r0["validate"] == r1["validate"]
    log0 = (out / "logs" / "rank0.log").read_text()
    assert log0.count("overlay videos of global step") == 3  # 2 fit render passes + validate(), one line each
    assert "Traceback" not in log0 and list(mnt.rglob("*.mp4")) == []
