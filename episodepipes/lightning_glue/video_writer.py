"""`OverlayVideoWriter`: rank 0 draws the model's outputs on the pinned episodes and writes one mp4 each.

It is a `RenderGate`, so it also opens the video pipes on render passes (``every_n_passes``) and runs
the fail-fast checks. Files: ``<dirpath>/<loader>/<episode>_step<global_step:08d>.mp4`` (suffix
``_validate`` in ``trainer.validate()``, ``_sanity`` in the sanity check), at the episode's fps from the index.
"""

from __future__ import annotations

import importlib
import logging
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import cv2
import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.loggers import TensorBoardLogger, WandbLogger
from lightning.pytorch.trainer.states import TrainerFn

from episodepipes.lightning_glue.gating import RenderGate
from episodepipes.lightning_glue.mp4 import AtomicMp4, remove_partials
from episodepipes.lightning_glue.names import video_stem
from episodepipes.lightning_glue.overlay import draw_overlay

log = logging.getLogger(__name__)


class OverlayVideoWriter(RenderGate):
    """Collect video-loader frames and outputs from ``on_validation_batch_end``; write atomically on rank 0.

    Args:
        dirpath: folder for the videos.
        camera: camera to render (default: the episode's first camera in the index).
        every_n_passes, render_sanity_check, pg_timeout: see `RenderGate`.
        log_videos: also hand each video to a TensorBoard or W&B logger in use.

    Override `render` to draw your own overlay.
    """

    def __init__(self, dirpath: str | os.PathLike, *, camera: str | None = None, every_n_passes: int = 10,
                 render_sanity_check: bool = False, pg_timeout: timedelta | None = None,
                 log_videos: bool = True) -> None:
        super().__init__(every_n_passes=every_n_passes, render_sanity_check=render_sanity_check,
                         pg_timeout=pg_timeout)
        self.dirpath, self.camera, self.log_videos = Path(dirpath), camera, log_videos
        self.written: list[Path] = []  # every video this writer published, in order
        self._files: dict[tuple[str, str], AtomicMp4] = {}
        self._tb_ok: bool | None = None

    def render(self, frames: np.ndarray, batch: dict[str, Any], outputs: Any) -> np.ndarray:
        """Draw on uint8 RGB ``[B, H, W, 3]`` frames and return them (same shape). Default: `draw_overlay`."""
        return draw_overlay(frames, batch, outputs)

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        if trainer.is_global_zero and self.dirpath.is_dir():
            for sub in [self.dirpath, *(p for p in self.dirpath.iterdir() if p.is_dir())]:
                remove_partials(sub)

    def on_validation_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                                batch_idx: int, dataloader_idx: int = 0) -> None:
        super().on_validation_batch_end(trainer, pl_module, outputs, batch, batch_idx, dataloader_idx)
        loaders = self._loaders
        if not trainer.is_global_zero or loaders is None or not loaders.is_video(dataloader_idx):
            return
        name, index = loaders.name(dataloader_idx), loaders.pipe(dataloader_idx).index
        camera = self.camera or next(iter(index.episode(batch["episode"][0]).cameras))
        if camera not in batch:
            raise KeyError(f"camera={camera!r} is not in the video batch; cameras there: "
                           f"{sorted(index.episode(batch['episode'][0]).cameras)}")
        # copy: the pipe reuses batch buffers once nobody holds them
        frames = np.ascontiguousarray(batch[camera].permute(0, 2, 3, 1).cpu().numpy())
        frames = self.render(frames, batch, outputs)
        if not isinstance(frames, np.ndarray) or frames.shape[0] != len(batch["episode"]) or frames.ndim != 4:
            raise ValueError(f"{type(self).__name__}.render returned {type(frames).__name__} of shape "
                             f"{getattr(frames, 'shape', None)}; it should return uint8 [B, H, W, 3] frames")
        suffix = {TrainerFn.VALIDATING: "_validate"}.get(trainer.state.fn, "")
        suffix = "_sanity" if trainer.sanity_checking else suffix
        for episode, frame in zip(batch["episode"], frames):
            f = self._files.get((name, episode))
            if f is None:
                path = self.dirpath / name / f"{video_stem(episode)}_step{trainer.global_step:08d}{suffix}.mp4"
                f = self._files[(name, episode)] = AtomicMp4(path, fps=index.episode(episode).fps)
            f.write(frame)

    def end_render_pass(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        files, self._files = self._files, {}
        for (name, episode), f in files.items():
            path = f.close()
            if path is None:
                continue
            self.written.append(path)
            log.info("wrote %s (%d frames at %g fps)", path, f.frames, f.fps)
            if self.log_videos:
                self._to_loggers(trainer, f"val_video/{name}/{episode}", path, f.fps)

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        super().on_exception(trainer, pl_module, exception)
        self._discard()

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        super().teardown(trainer, pl_module, stage)
        self._discard()

    def _discard(self) -> None:
        files, self._files = self._files, {}
        for f in files.values():
            f.discard()

    def _to_loggers(self, trainer: pl.Trainer, tag: str, path: Path, fps: float) -> None:
        for lg in trainer.loggers:
            if isinstance(lg, WandbLogger):
                lg.log_video(tag, videos=[str(path)], step=trainer.global_step, fps=[fps], format=["mp4"])
            elif isinstance(lg, TensorBoardLogger) and self._tensorboard_can_video():
                video = torch.from_numpy(read_rgb(path)).permute(0, 3, 1, 2)[None]  # [1, T, 3, H, W]
                lg.experiment.add_video(tag, video, global_step=trainer.global_step, fps=fps)

    def _tensorboard_can_video(self) -> bool:
        if self._tb_ok is None:  # torch's add_video encodes a GIF with moviepy.editor
            try:
                importlib.import_module("moviepy.editor")
                self._tb_ok = True
            except ImportError:
                self._tb_ok = False
                log.warning("TensorBoard needs moviepy<2 (moviepy.editor) for add_video; it is not installed, so "
                            "videos are written to %s only. `pip install 'moviepy<2'` to log them.", self.dirpath)
        return self._tb_ok


def read_rgb(path: str | os.PathLike) -> np.ndarray:
    """All frames of a video as uint8 RGB ``[T, H, W, 3]``."""
    cap = cv2.VideoCapture(str(path))
    frames = []
    while True:
        ok, bgr = cap.read()
        if not ok:
            break
        frames.append(bgr[:, :, ::-1])
    cap.release()
    return np.stack(frames) if frames else np.zeros((0, 1, 1, 3), np.uint8)
