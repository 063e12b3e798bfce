"""`OverlayVideoWriter`: rank 0 draws the model's outputs on the pinned episodes and writes one mp4 each.

It is a `RenderGate`, so it also opens the video pipes on render passes (``every_n_passes``) and runs
the fail-fast checks. Files: ``<dirpath>/<loader>/<episode>_step<global_step:08d>.mp4`` (suffix
``_validate`` in ``trainer.validate()``, ``_sanity`` in the sanity check), at the episode's fps from the index,
H.264 when PyAV is installed (see `AtomicMp4`). Loggers get the videos afterwards, in a background thread
(see `episodepipes.lightning_glue.upload`).

Ownership: a writer touches only its own files. Its partial files carry a per-run token, a crashed run's partial
files are removed only once provably abandoned (`episodepipes.lightning_glue.partials`), and a final name that
already exists (another run's video at the same step) is kept: the new video gets ``<name>-v1.mp4``, ``-v2``...
The loader folders under ``dirpath`` are made with `episodepipes.safefile.make_dir`, so a symlink planted there is
refused by name instead of followed.

A full disk (or quota, or file size limit) under ``dirpath`` does not stop training: the pass's videos are all
closed and removed, one error line names the folder and the fix, the step is added to ``failed_steps``, and the
next render pass tries again. Any other render error still raises, after every open video is closed and removed.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import cv2
import lightning.pytorch as pl
import numpy as np
from lightning.pytorch.loggers import Logger
from lightning.pytorch.trainer.states import TrainerFn

from episodepipes.index import EpisodeIndex
from episodepipes.lightning_glue.fps import fps_problem
from episodepipes.lightning_glue.gating import RenderGate
from episodepipes.lightning_glue.mp4 import AtomicMp4, is_disk_full
from episodepipes.lightning_glue.names import video_stem
from episodepipes.lightning_glue.overlay import draw_overlay, tile_cameras, with_index_names
from episodepipes.lightning_glue.partials import remove_abandoned, run_token
from episodepipes.lightning_glue.upload import Uploader, choose_loggers
from episodepipes.safefile import make_dir

log = logging.getLogger(__name__)


class OverlayVideoWriter(RenderGate):
    """Collect video-loader frames and outputs from ``on_validation_batch_end``; write atomically on rank 0.

    Args:
        dirpath: folder for the videos.
        camera: the camera to render (default: the episode's first camera in the index); same as ``cameras=[camera]``.
        cameras: several cameras tiled left to right; the overlay is drawn in the first one's pixel coordinates.
            Checked against each video pipe's index when validation starts, on every rank.
        gt_key: a batch array of ground-truth points in pixels (e.g. ``"keypoints"``), drawn in a second colour
            beside the predictions, with a legend (default None: predictions only); with a window on it in the
            video pipe (``horizon={"keypoints": H}``) its steps are drawn as a polyline (`draw_overlay`).
        every_n_passes, render_sanity_check, pg_timeout: see `RenderGate`.
        log_to: which of the trainer's loggers get each video: ``"auto"`` (default: every TensorBoard logger, as a
            GIF, and every logger with ``log_video`` such as W&B, as the mp4), None (files only), or a list of
            logger class names (``["WandbLogger"]``). Uploads run in a background thread after the file is
            written, outside the timed render span, and are waited for at teardown.

    Override `render` to draw your own overlay.

    Attributes:
        written: every video this writer published, in order (a name may carry ``-v1``... if another run's video
            already had it).
        failed_steps: the global steps whose render pass found the disk under ``dirpath`` full (videos dropped,
            one error line logged each, training went on).
        owner: the per-run token in this writer's partial file names.
    """

    def __init__(self, dirpath: str | os.PathLike, *, camera: str | None = None, cameras: Sequence[str] | None = None,
                 gt_key: str | None = None, every_n_passes: int = 10, render_sanity_check: bool = False,
                 pg_timeout: timedelta | None = None, log_to: str | Sequence[str] | None = "auto") -> None:
        super().__init__(every_n_passes=every_n_passes, render_sanity_check=render_sanity_check,
                         pg_timeout=pg_timeout)
        if camera is not None and cameras is not None:
            raise ValueError(f"camera={camera!r} and cameras={cameras!r}: pass one (camera=x is cameras=[x])")
        if cameras is not None and (isinstance(cameras, str) or not cameras
                                    or not all(isinstance(c, str) for c in cameras)):
            raise ValueError(f"cameras={cameras!r} should be a non-empty list of camera names")
        if log_to != "auto" and log_to is not None and (isinstance(log_to, str) or not all(
                isinstance(n, str) for n in log_to)):
            raise ValueError(f"log_to={log_to!r} should be 'auto', None or a list of logger class names")
        self.dirpath, self.gt_key, self.log_to = Path(dirpath), gt_key, log_to
        self.cameras: list[str] | None = [camera] if camera is not None else (list(cameras) if cameras else None)
        self.camera = camera
        self.written: list[Path] = []  # every video this writer published, in order
        self.failed_steps: list[int] = []  # global steps whose render pass hit a full disk (videos dropped)
        self.owner = run_token()  # names this writer's partial files; no other run uses it
        self._disk_full = False  # this render pass hit a full disk: write nothing more until the next pass
        self.uploader = Uploader()
        self._files: dict[tuple[str, str], AtomicMp4] = {}
        self._loggers: list[Logger] = []

    def render(self, frames: np.ndarray, batch: dict[str, Any], outputs: Any) -> np.ndarray:
        """Draw on uint8 RGB ``[B, H, W, 3]`` frames and return them (same shape). Default: `draw_overlay`.

        Override it to draw your own overlay; it runs on rank 0 only, inside the render pass the other ranks
        wait for, so keep it fast.

        Args:
            frames: a copy of the batch's frames (the ``cameras`` tiled left to right), yours to draw on.
            batch: the video batch, as the pipe yields it (``episode``, ``frame``, arrays...).
            outputs: what ``validation_step`` returned for this batch.
        """
        return draw_overlay(frames, batch, outputs, gt_key=self.gt_key)

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        self._loggers = choose_loggers(trainer.loggers, self.log_to)  # every rank: a bad log_to fails everywhere
        if trainer.is_global_zero and self.dirpath.is_dir():
            for sub in [self.dirpath, *(p for p in self.dirpath.iterdir() if p.is_dir() and not p.is_symlink())]:
                remove_abandoned(sub)  # a crashed run's leftovers only; another live run's files stay

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_validation_start(trainer, pl_module)
        self._disk_full = False
        if self._loaders is not None:  # on every rank, before any batch: a rank-0-only error would desync
            for name, pipe in (self._loaders.videos or {}).items():
                self.check_pipe(name, pipe.index)

    def check_pipe(self, name: str, index: EpisodeIndex) -> None:
        """Raise if ``cameras`` or ``gt_key`` is missing from the video pipe ``name``'s index, naming what is there,
        or if an episode's fps is one no mp4 stores (`episodepipes.lightning_glue.fps.FPS_RANGE`).

        Run on every rank when validation starts, so a typo fails everywhere at once instead of on rank 0 at
        its first render pass (which would leave the other ranks waiting on a dead peer).

        Args:
            name: the video loader's name in the `ValLoaders`, for the message.
            index: that pipe's `EpisodeIndex`.
        """
        cams = sorted({c for e in index.episodes for c in e.cameras})
        for c in self.cameras or ():
            if c not in cams:
                raise ValueError(f"OverlayVideoWriter camera={c!r} is not a camera of video loader {name!r} "
                                 f"(index {index.root}); cameras there: {cams}")
        for e in index.episodes:
            problem = fps_problem(e.fps)
            if problem:
                raise ValueError(f"episode {e.id!r} of video loader {name!r} (index {index.root}) has fps={e.fps!r}, "
                                 f"which {problem}; fix that episode's fps in the dataset, or leave it out of the "
                                 "video loader's index")
        arrays = sorted({k for e in index.episodes for k in e.arrays})
        if self.gt_key is not None and self.gt_key not in arrays:
            raise ValueError(f"OverlayVideoWriter gt_key={self.gt_key!r} is not an array of video loader {name!r} "
                             f"(index {index.root}); arrays there: {arrays}")

    def on_validation_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                                batch_idx: int, dataloader_idx: int = 0) -> None:
        super().on_validation_batch_end(trainer, pl_module, outputs, batch, batch_idx, dataloader_idx)
        loaders = self._loaders
        if not trainer.is_global_zero or loaders is None or not loaders.is_video(dataloader_idx) or self._disk_full:
            return
        name, index = loaders.name(dataloader_idx), loaders.pipe(dataloader_idx).index
        batch = with_index_names(batch, index.episode(batch["episode"][0]))  # a names="lerobot" pipe's batch too
        cameras = self.cameras or [next(iter(index.episode(batch["episode"][0]).cameras))]
        for camera in cameras:
            if camera not in batch:
                raise KeyError(f"camera={camera!r} is not in the video batch; cameras there: "
                               f"{sorted(index.episode(batch['episode'][0]).cameras)}")
        # copy: the pipe reuses batch buffers once nobody holds them; a camera window ([B, W, 3, H, W], history=)
        # is drawn at its last step, the current one when it has no horizon
        views = [np.ascontiguousarray((batch[c] if batch[c].ndim == 4 else batch[c][:, -1]).permute(0, 2, 3, 1)
                                      .cpu().numpy()) for c in cameras]
        frames = self.render(tile_cameras(views, cameras), batch, outputs)
        if not isinstance(frames, np.ndarray) or frames.shape[0] != len(batch["episode"]) or frames.ndim != 4:
            raise ValueError(f"{type(self).__name__}.render returned {type(frames).__name__} of shape "
                             f"{getattr(frames, 'shape', None)}; it should return uint8 [B, H, W, 3] frames")
        suffix = {TrainerFn.VALIDATING: "_validate"}.get(trainer.state.fn, "")
        suffix = "_sanity" if trainer.sanity_checking else suffix
        folder = self.dirpath / name
        try:
            for episode, frame in zip(batch["episode"], frames):
                f = self._files.get((name, episode))
                if f is None:
                    path = folder / f"{video_stem(episode)}_step{trainer.global_step:08d}{suffix}.mp4"
                    if any(g.path == path for g in self._files.values()):
                        raise ValueError(f"episodes {episode!r} and another pinned episode map to one video file "
                                         f"{path}; pin episodes whose ids differ in more than characters outside "
                                         "A-Z a-z 0-9 _ - .")
                    self.dirpath.mkdir(parents=True, exist_ok=True)  # the user's folder: a link there is theirs
                    make_dir(folder)  # ours: a link planted in its place is refused, not followed
                    f = self._files[(name, episode)] = AtomicMp4(path, fps=index.episode(episode).fps,
                                                                 owner=self.owner)
                f.write(frame)
        except OSError as e:
            if not is_disk_full(e):
                raise
            self._drop_pass(trainer, folder, e)

    def end_render_pass(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Publish this pass's videos (one atomic rename each) and hand them to the loggers' upload thread.

        Args:
            trainer: the trainer; its ``global_step`` is the step the loggers record.
            pl_module: the module being validated (unused).
        """
        files, self._files = self._files, {}
        for i, ((name, episode), f) in enumerate(files.items()):
            try:
                path = f.close()  # on an error it removed its own partial file
            except BaseException as e:
                for g in list(files.values())[i + 1:]:  # every other open video is closed and removed too
                    g.discard()
                if not is_disk_full(e):
                    raise
                self._drop_pass(trainer, self.dirpath / name, e)  # type: ignore[arg-type]
                return
            if path is None:
                continue
            if path != f.path:
                log.warning("%s already exists (another run's video?): kept it, wrote %s beside it", f.path, path)
            self.written.append(path)
            log.info("wrote %s (%d frames at %g fps, %s)", path, f.frames, f.fps, f.codec)
            # after the file is complete, in the background: not part of the render pass the other ranks wait for
            self.uploader.submit(self._loggers, f"val_video/{name}/{episode}", path, f.fps, trainer.global_step)

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        super().on_exception(trainer, pl_module, exception)
        self._discard()
        self.uploader.join()

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        super().teardown(trainer, pl_module, stage)
        self._discard()
        self.uploader.join()  # every video handed to the loggers before the loggers are finalized

    def _drop_pass(self, trainer: pl.Trainer, folder: Path, e: OSError) -> None:
        """A full disk: drop this pass's videos, say so in one line, and let training go on."""
        self._discard()
        self._disk_full = True
        self.failed_steps.append(trainer.global_step)
        log.error("overlay videos of global step %d not written: no space for them in %s ([Errno %s] %s); its "
                  "unfinished videos were closed and removed. Free space there (or give OverlayVideoWriter "
                  "a dirpath on a larger disk): training goes on and the next render pass tries again",
                  trainer.global_step, folder, e.errno, e.strerror)

    def _discard(self) -> None:
        files, self._files = self._files, {}
        for f in files.values():
            f.discard()


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
