"""The default overlay (ground truth, legend, camera tiling) and handing videos to loggers (log_to)."""

import io
import logging
import time

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from ddp.app import EpisodeData, TinyModel
from helpers import make_shards
from lightning.pytorch.loggers import CSVLogger, Logger, TensorBoardLogger
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from episodepipes.lightning_glue import OverlayVideoWriter, draw_overlay
from episodepipes.lightning_glue.overlay import GROUND_TRUTH, POINT, tile_cameras
from episodepipes.lightning_glue.video_writer import read_rgb

FPS, LENGTH = 7.5, 12


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return str(make_shards(tmp_path_factory.mktemp("ovl") / "s", num_episodes=3, length=LENGTH, height=32,
                           width=48, fps=FPS))


def _validate(writer, root, logger=False):
    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=logger, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=[writer])
    trainer.validate(TinyModel(), datamodule=EpisodeData(root, pinned=["ep0000"]), verbose=False)
    return trainer


def test_ground_truth_is_drawn_in_its_own_colour_where_the_point_is_with_a_legend():
    frames = np.zeros((1, 120, 160, 3), np.uint8)
    batch = {"episode": ["ep1"], "frame": torch.tensor([0]), "keypoints": torch.tensor([[[40.0, 50.0]]])}
    out = draw_overlay(frames, batch, {"points": torch.tensor([[[110.0, 60.0]]])}, gt_key="keypoints")
    assert tuple(out[0, 50, 40]) == GROUND_TRUTH and tuple(out[0, 60, 110]) == POINT
    legend = out[0, 80:, :60].reshape(-1, 3)  # bottom-left: one marker per entry, in its colour
    assert any(tuple(p) == GROUND_TRUTH for p in legend) and any(np.abs(p - POINT).max() < 30 for p in legend)
    bare = draw_overlay(np.zeros((1, 120, 160, 3), np.uint8), batch, None)  # no gt_key: no gt, no legend
    assert not any(tuple(p) == GROUND_TRUTH for p in bare.reshape(-1, 3))
    with pytest.raises(KeyError, match="gt_key='kp' is not in the video batch"):
        draw_overlay(frames, batch, None, gt_key="kp")


def test_cameras_are_tiled_left_to_right_first_camera_at_the_origin():
    a, b = np.full((2, 20, 30, 3), 10, np.uint8), np.full((2, 16, 40, 3), 200, np.uint8)
    t = tile_cameras([a, b], ["front", "wrist"])
    assert t.shape == (2, 20, 70, 3)
    assert t[0, 2, 2, 0] == 10 and t[0, 2, 35, 0] == 200 and t[0, 18, 35].max() == 0  # shorter one padded black


def test_the_writer_tiles_cameras_and_draws_ground_truth(root, tmp_path):
    writer = OverlayVideoWriter(tmp_path, every_n_passes=1, cameras=["front", "wrist"], gt_key="keypoints",
                                log_to=None)
    _validate(writer, root)
    video = read_rgb(writer.written[0])
    assert video.shape == (LENGTH, 32, 96, 3)  # two 48-px cameras side by side
    green = (video[..., 1] > 180) & (video[..., 0] < 140) & (video[..., 2] < 140)
    assert green[:, :, :48].any()  # ground truth, on the first camera


class VideoRecorder(Logger):
    """A logger with W&B's public ``log_video(key, videos, step=None, **kwargs)`` that records its calls."""

    def __init__(self):
        super().__init__()
        self.calls = []

    name, version = "recorder", 0

    def log_metrics(self, metrics, step=None):
        pass

    def log_hyperparams(self, params, *args, **kwargs):
        pass

    def log_video(self, key, videos, step=None, **kwargs):
        self.calls.append((key, videos, step, kwargs))


def test_a_log_video_logger_gets_the_file_with_format_and_no_fps(root, tmp_path):
    rec = VideoRecorder()
    writer = OverlayVideoWriter(tmp_path / "v", every_n_passes=1)
    _validate(writer, root, logger=rec)  # teardown joins the upload thread
    assert rec.calls == [("val_video/pinned/ep0000", [str(writer.written[0])], 0, {"format": ["mp4"]})]


def test_log_to_none_uploads_nothing_and_unknown_names_are_refused_at_setup(root, tmp_path):
    rec = VideoRecorder()
    _validate(OverlayVideoWriter(tmp_path / "v", every_n_passes=1, log_to=None), root, logger=rec)
    assert rec.calls == []
    with pytest.raises(ValueError, match=r"log_to names 'WandbLogger', but the trainer's loggers are \['VideoRec"):
        _validate(OverlayVideoWriter(tmp_path / "v", log_to=["WandbLogger"]), root, logger=rec)
    with pytest.raises(ValueError, match="'CSVLogger', which cannot take a video"):
        _validate(OverlayVideoWriter(tmp_path / "v", log_to=["CSVLogger"]), root, logger=CSVLogger(tmp_path))
    with pytest.raises(ValueError, match="log_to='wandb'"):
        OverlayVideoWriter(tmp_path, log_to="wandb")


def test_tensorboard_gets_a_gif_with_every_frame_at_the_source_rate(root, tmp_path):
    writer = OverlayVideoWriter(tmp_path / "v", every_n_passes=1, log_to=["TensorBoardLogger"])
    _validate(writer, root, logger=TensorBoardLogger(tmp_path / "tb", name="", version=""))
    acc = EventAccumulator(str(tmp_path / "tb"), size_guidance={"images": 0})
    acc.Reload()
    (event,) = acc.Images("val_video/pinned/ep0000")
    gif = Image.open(io.BytesIO(event.encoded_image_string))
    durations = []
    for i in range(gif.n_frames):
        gif.seek(i)
        durations.append(gif.info["duration"])  # ms, whole centiseconds
    assert gif.n_frames == LENGTH and (event.width, event.height) == (48, 32)
    assert sum(durations[:-1]) == pytest.approx((LENGTH - 1) * 1000 / FPS, abs=10)  # 7.5 fps on average
    assert all(120 <= d <= 150 for d in durations[:-1])  # no frame merged into a long one


class SlowRecorder(VideoRecorder):
    def log_video(self, key, videos, step=None, **kwargs):
        time.sleep(1.5)  # a slow upload
        super().log_video(key, videos, step, **kwargs)


class BrokenRecorder(VideoRecorder):
    def log_video(self, key, videos, step=None, **kwargs):
        raise ConnectionError("no network")


def test_uploads_run_after_the_timed_render_pass_and_are_joined_at_teardown(root, tmp_path, caplog):
    rec = SlowRecorder()
    with caplog.at_level(logging.INFO, logger="episodepipes"):
        _validate(OverlayVideoWriter(tmp_path / "v", every_n_passes=1), root, logger=rec)
    (took,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("render pass at")]
    assert float(took.split(" took ")[1].split(" s")[0]) < 1.5  # the slow upload is not in the timed span
    assert len(rec.calls) == 1  # ... and it finished before validate() returned


def test_a_failed_upload_is_logged_with_its_file_and_the_file_is_kept(root, tmp_path, caplog):
    writer = OverlayVideoWriter(tmp_path / "v", every_n_passes=1)
    with caplog.at_level(logging.ERROR, logger="episodepipes"):
        _validate(writer, root, logger=BrokenRecorder())
    assert any(f"could not log video {writer.written[0]}" in r.getMessage() and "no network" in r.getMessage()
               for r in caplog.records)
    assert writer.written[0].exists()
