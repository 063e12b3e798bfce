import logging
import signal
import subprocess
import sys

import cv2
import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from ddp.app import EpisodeData, PassCounters, TinyModel
from helpers import make_shards

from episodepipes.lightning_glue import AtomicMp4, OverlayVideoWriter, draw_overlay
from episodepipes.lightning_glue.overlay import POINT, TRAJECTORY
from episodepipes.lightning_glue.partials import PARTIAL, remove_abandoned
from episodepipes.lightning_glue.video_writer import read_rgb

FPS, LENGTH = 7.5, 12


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return str(make_shards(tmp_path_factory.mktemp("writer") / "s", num_episodes=6, length=LENGTH, height=32,
                           width=48, fps=FPS))


def _trainer(callbacks, **kw):
    kw = {"max_epochs": 4, "num_sanity_val_steps": 2, "logger": False, **kw}
    return pl.Trainer(accelerator="cpu", devices=1, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, callbacks=callbacks, **kw)


def _frames(n=5, h=24, w=32, value=0):
    return [np.full((h, w, 3), value + i, np.uint8) for i in range(n)]


def test_one_mp4_per_pinned_episode_per_render_pass_at_the_source_fps(root, tmp_path):
    writer, counters = OverlayVideoWriter(tmp_path / "v", every_n_passes=2), PassCounters()
    trainer = _trainer([writer, counters])
    dm = EpisodeData(root, pinned=["ep0000", "ep0002"], video_batch=5, max_batches=10)
    trainer.fit(TinyModel(), datamodule=dm)
    steps = [p["step"] for p in counters.passes[1:]]  # fit passes 1..4
    expected = {f"{e}_step{s:08d}.mp4" for e in ("ep0000", "ep0002") for s in (steps[1], steps[3])}
    folder = tmp_path / "v" / "pinned"
    assert {p.name for p in folder.iterdir()} == expected
    assert sorted(p.name for p in writer.written) == sorted(expected)
    for name in expected:
        cap = cv2.VideoCapture(str(folder / name))
        assert cap.get(cv2.CAP_PROP_FPS) == pytest.approx(FPS)
        cap.release()
        assert read_rgb(folder / name).shape == (LENGTH, 32, 48, 3)


def test_a_capped_pipe_writes_the_frames_it_read(root, tmp_path):
    writer = OverlayVideoWriter(tmp_path, every_n_passes=1)
    model = TinyModel()
    _trainer([writer]).validate(model, datamodule=EpisodeData(root, pinned=["ep0000", "ep0001"], video_batch=5,
                                                              max_batches=3), verbose=False)
    assert [p.name for p in writer.written] == ["ep0000_step00000000_validate.mp4",
                                                "ep0001_step00000000_validate.mp4"]
    assert [len(read_rgb(p)) for p in writer.written] == [LENGTH, 15 - LENGTH]


def test_atomic_write_publishes_only_complete_files(tmp_path):
    path = tmp_path / "ep_step1.mp4"
    with AtomicMp4(path, fps=5) as f:
        for fr in _frames():
            f.write(fr)
        assert not path.exists() and f.tmp.exists()
    assert path.exists() and not f.tmp.exists() and len(read_rgb(path)) == 5
    old = path.read_bytes()
    with pytest.raises(RuntimeError, match="crash"), AtomicMp4(path, fps=5) as f:  # a failing rewrite
        f.write(_frames(1)[0])
        raise RuntimeError("crash mid-write")
    assert path.read_bytes() == old and list(tmp_path.glob(f".*{PARTIAL}")) == []


KILLED = """
import sys, time, numpy as np
from episodepipes.lightning_glue import AtomicMp4
f = AtomicMp4(sys.argv[1], fps=5)
for i in range(3):
    f.write(np.full((24, 32, 3), i, np.uint8))
print(f.tmp, flush=True)
time.sleep(600)
"""


def test_a_killed_writer_leaves_no_file_under_the_final_name(tmp_path):
    path = tmp_path / "pinned" / "ep_step2.mp4"
    proc = subprocess.Popen([sys.executable, "-c", KILLED, str(path)], stdout=subprocess.PIPE, text=True)
    tmp = proc.stdout.readline().strip()
    proc.send_signal(signal.SIGKILL)  # the process dies here: no close(), no discard()
    proc.wait()
    proc.stdout.close()
    assert not path.exists() and [str(p) for p in path.parent.glob(f".*{PARTIAL}")] == [tmp]
    OverlayVideoWriter(tmp_path).setup(_trainer([]), TinyModel(), "fit")  # a new run clears a dead run's leftovers
    assert list(path.parent.iterdir()) == [] and remove_abandoned(path.parent) == 0


class _CrashingWriter(OverlayVideoWriter):
    def render(self, frames, batch, outputs):
        if int(batch["frame"][0]) >= 10:
            raise RuntimeError("render crashed")
        return super().render(frames, batch, outputs)


def test_a_crash_during_a_render_pass_leaves_no_video(root, tmp_path):
    writer = _CrashingWriter(tmp_path, every_n_passes=1)
    with pytest.raises(RuntimeError, match="render crashed"):
        _trainer([writer]).validate(TinyModel(), datamodule=EpisodeData(root, pinned=["ep0000"], video_batch=5),
                                    verbose=False)
    assert list(tmp_path.rglob("*.mp4")) == [] and writer.written == []


class _WhiteWriter(OverlayVideoWriter):
    def render(self, frames, batch, outputs):
        assert frames.shape[1:] == (32, 48, 3) and set(outputs) == {"points", "trajectories"}
        return np.full_like(frames, 255)


def test_render_hook_replaces_the_default(root, tmp_path):
    writer = _WhiteWriter(tmp_path, every_n_passes=1, camera="wrist")
    _trainer([writer]).validate(TinyModel(), datamodule=EpisodeData(root, pinned=["ep0000"]), verbose=False)
    assert read_rgb(writer.written[0]).mean() > 250


def test_unknown_camera_is_named_when_validation_starts_even_on_a_pass_that_renders_nothing(root, tmp_path):
    # every_n_passes=100: no pass renders, so before this check the wrong camera was never noticed (and under
    # DDP it surfaced on rank 0 only, at the first render); now every rank checks at validation start
    writer = OverlayVideoWriter(tmp_path, every_n_passes=100, camera="side")
    msg = r"camera='side' is not a camera of video loader 'pinned'.*\['front', 'wrist'\]"
    with pytest.raises(ValueError, match=msg):
        _trainer([writer], max_epochs=1, num_sanity_val_steps=0).fit(
            TinyModel(), datamodule=EpisodeData(root, pinned=["ep0000"]))
    with pytest.raises(ValueError, match=r"gt_key='kp' is not an array .*'keypoints'"):
        _trainer([OverlayVideoWriter(tmp_path, every_n_passes=100, gt_key="kp")], max_epochs=1,
                 num_sanity_val_steps=0).fit(TinyModel(), datamodule=EpisodeData(root, pinned=["ep0000"]))
    with pytest.raises(ValueError, match="pass one"):
        OverlayVideoWriter(tmp_path, camera="front", cameras=["wrist"])


def test_default_overlay_draws_points_trajectories_and_labels():
    frames = np.zeros((2, 64, 96, 3), np.uint8)
    batch = {"episode": ["ep7", "ep7"], "frame": torch.tensor([3, 4])}
    outputs = {"points": torch.tensor([[[60.0, 40.0]], [[10.0, 50.0]]]),
               "trajectories": torch.tensor([[[70.0, 10.0], [90.0, 10.0]], [[5.0, 60.0], [5.0, 60.0]]])}
    out = draw_overlay(frames, batch, outputs)
    assert tuple(out[0, 40, 60]) == POINT
    assert np.allclose(out[0, 10, 80], TRAJECTORY, atol=40)  # antialiased
    assert out[0, :16, :40].max() > 200  # the label
    assert out[1, 40, 60].max() == 0
    draw_overlay(np.zeros((1, 8, 8, 3), np.uint8), {"episode": ["e"]}, None)  # outputs optional
    with pytest.raises(ValueError, match=r"outputs\['points'\] has shape"):
        draw_overlay(frames, batch, {"points": torch.zeros(3, 1, 2)})


def test_render_pass_duration_is_logged(root, tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="episodepipes"):
        _trainer([OverlayVideoWriter(tmp_path, every_n_passes=1)]).validate(
            TinyModel(), datamodule=EpisodeData(root, pinned=["ep0000"]), verbose=False)
    assert any("render pass at global step 0 took" in r.getMessage() for r in caplog.records)


def _probe(path):
    import av

    with av.open(str(path)) as c:
        s = c.streams.video[0]
        frames = [f.to_ndarray(format="rgb24") for f in c.decode(s)]
        return s.codec_context.name, s.average_rate, frames


def test_videos_are_h264_at_the_source_fps_decoded_back_with_pyav(root, tmp_path):
    writer = OverlayVideoWriter(tmp_path, every_n_passes=1)
    _trainer([writer]).validate(TinyModel(), datamodule=EpisodeData(root, pinned=["ep0000"]), verbose=False)
    codec, rate, frames = _probe(writer.written[0])
    assert codec == "h264" and rate == FPS and len(frames) == LENGTH and frames[0].shape == (32, 48, 3)


@pytest.mark.parametrize("codec", ["h264", "mp4v"])
def test_odd_frame_sizes_are_padded_to_even_by_repeating_the_edge(tmp_path, codec):
    frame = np.zeros((23, 31, 3), np.uint8)
    frame[:, -1] = 200  # the last column, repeated into the padding
    with AtomicMp4(tmp_path / "odd.mp4", fps=12.5, codec=codec) as f:
        for _ in range(4):
            f.write(frame)
    name, rate, frames = _probe(tmp_path / "odd.mp4")
    assert name == {"h264": "h264", "mp4v": "mpeg4"}[codec] and rate == 12.5 and len(frames) == 4
    assert frames[0].shape == (24, 32, 3) and frames[0][10, 31].mean() > 150 and frames[0][10, 5].mean() < 40


def test_bad_codec_and_fps_are_refused(tmp_path):
    with pytest.raises(ValueError, match="codec='vp9'"):
        AtomicMp4(tmp_path / "a.mp4", fps=5, codec="vp9")
    for fps in (0, float("nan"), float("inf"), True):
        with pytest.raises(ValueError, match="fps="):
            AtomicMp4(tmp_path / "a.mp4", fps=fps)
