"""`RenderGate`: binds the video pipes' gates to the trainer, so they open on rank 0 on render passes only.

Where N is set: ``RenderGate(every_n_passes=N)`` (or `OverlayVideoWriter`, which is a `RenderGate`).
This callback is the one place; the pipes know nothing about Lightning.

Lightning has no public counter of validation passes, so the callback counts them in
``on_validation_start`` (fit passes only, sanity check excluded). That hook fires after ``iter()`` of
the first loader but before any batch is drawn, and the gate decides at its first ``next()``, so the
predicate always sees this pass's count. Lightning's throwaway ``iter()`` at setup reaches no hook and
no ``next()``, so it counts nothing and decides nothing.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.trainer.states import TrainerFn

from episodepipes.lightning_glue import checks
from episodepipes.lightning_glue.loaders import ValLoaders

log = logging.getLogger(__name__)


def is_render_pass(*, global_rank: int, fn: str | None, sanity_checking: bool, fit_pass: int, every_n_passes: int,
                   render_sanity_check: bool = False) -> bool:
    """The gate rule: rank 0 only; ``validate()`` always; in a fit, passes N, 2N, ... (1-based, sanity excluded).

    A pure function of the trainer's state, so the schedule is testable without a trainer.

    Args:
        global_rank: the rank asking; only rank 0 renders.
        fn: ``trainer.state.fn`` ("fit", "validate", ...); any other stage renders nothing.
        sanity_checking: ``trainer.sanity_checking``.
        fit_pass: 1-based count of this fit's validation passes, sanity check excluded.
        every_n_passes: N, the render period in validation passes of a fit.
        render_sanity_check: whether the sanity check renders too.
    """
    if global_rank != 0:
        return False
    if sanity_checking:
        return render_sanity_check
    if fn == TrainerFn.VALIDATING:
        return True
    if fn == TrainerFn.FITTING:
        return fit_pass > 0 and fit_pass % every_n_passes == 0
    return False


class RenderGate(pl.Callback):
    """Open the video pipes of the `ValLoaders` on rank 0 on every ``every_n_passes``-th validation pass of a fit.

    Also renders in ``trainer.validate()``, and in the sanity check when ``render_sanity_check``.
    With no trainer bound (before the first validation, after teardown) the gates are open.

    Fail-fast checks it runs: every rank's loader lengths agree; ``self.log`` from a video batch raises;
    each render pass logs its duration and warns past half of ``pg_timeout`` (the DDP process-group
    timeout: Lightning exposes no public getter for it, so pass the one you gave ``DDPStrategy``;
    under DDP without it, torch's default of 30 minutes is assumed).

    Args:
        every_n_passes: N: render on validation passes N, 2N, ... of a fit (a positive int; 1 renders every pass).
            Set here and nowhere else; the count is saved in checkpoints, so a resumed fit keeps the schedule.
        render_sanity_check: render in the sanity check too (default False: it would cost a render before training).
        pg_timeout: the ``timeout`` given to ``DDPStrategy``, against which render durations are checked.
    """

    def __init__(self, *, every_n_passes: int = 10, render_sanity_check: bool = False,
                 pg_timeout: timedelta | None = None) -> None:
        if isinstance(every_n_passes, bool) or not isinstance(every_n_passes, int) or every_n_passes < 1:
            raise ValueError(f"every_n_passes={every_n_passes!r} should be a positive int (1 renders every pass)")
        self.every_n_passes, self.render_sanity_check, self.pg_timeout = every_n_passes, render_sanity_check, pg_timeout
        self.fit_passes = 0  # validation passes of the current fit, sanity check excluded
        self.render_passes = 0  # passes this callback opened the gates for (on this rank)
        self._trainer: pl.Trainer | None = None
        self._loaders: ValLoaders | None = None
        self._checked: ValLoaders | None = None  # held, not its id: a freed object's id is reused
        self._warned = False
        self._guard: checks.LogGuard | None = None
        self._rendering = False
        self._video_start: float | None = None

    # -- the predicate the gates call at the first next() of a pass --------------------------------------
    def should_render(self) -> bool:
        """Decide now, from the trainer's state (open when no trainer is bound)."""
        t = self._trainer
        if t is None:
            return True
        open_ = is_render_pass(global_rank=t.global_rank, fn=t.state.fn, sanity_checking=t.sanity_checking,
                               fit_pass=self.fit_passes, every_n_passes=self.every_n_passes,
                               render_sanity_check=self.render_sanity_check)
        if open_ and not self._rendering:  # the first gate of this pass to open: rank 0's extra work starts
            self._rendering, self._video_start = True, time.perf_counter()
            self.render_passes += 1
        return open_

    # -- hooks ------------------------------------------------------------------------------------------
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == TrainerFn.FITTING:
            self.fit_passes = 0  # a new fit restarts the schedule; a checkpoint restored after this resumes it

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking:
            self.fit_passes += 1
        self._rendering, self._video_start = False, None
        loaders = trainer.val_dataloaders
        if not isinstance(loaders, ValLoaders):
            if loaders is not None and not self._warned:
                log.warning("val_dataloader() returned %s, not ValLoaders: %s binds no gate (video pipes stay "
                            "open on every rank). Return ValLoaders(metrics={...}, videos={...}).",
                            type(loaders).__name__, type(self).__name__)
                self._warned = True
            return
        self._trainer, self._loaders = trainer, loaders
        if self._checked is not loaders:  # once per ValLoaders: a collective, so every rank decides alike
            checks.check_same_lengths(loaders, pl_module)
            self._checked = loaders
        for pipe in (loaders.videos or {}).values():
            pipe.gate.bind(self.should_render)

    def on_validation_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                                  batch_idx: int, dataloader_idx: int = 0) -> None:
        if self._loaders is not None and self._loaders.is_video(dataloader_idx):
            self._guard = checks.LogGuard(pl_module, self._loaders.name(dataloader_idx), dataloader_idx)

    def on_validation_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                                batch_idx: int, dataloader_idx: int = 0) -> None:
        self._drop_guard()

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._close_pipes()
        if self._rendering:  # timed from the gate opening to the last video written
            self.end_render_pass(trainer, pl_module)
            seconds = time.perf_counter() - (self._video_start or 0.0)
            timeout = checks.pg_timeout(trainer, self.pg_timeout)
            checks.report_render_duration(seconds, timeout, step=trainer.global_step)
        self._rendering, self._video_start = False, None

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._drop_guard()
        self._close_pipes()

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._drop_guard()
        self._close_pipes()
        if self._loaders is not None:
            for pipe in (self._loaders.videos or {}).values():
                pipe.gate.bind(None)  # no trainer: the pipe is a plain open iterable again
        self._trainer = self._loaders = self._checked = None

    def end_render_pass(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Called on rank 0 at the end of each render pass, inside the timed span; subclasses write here.

        Args:
            trainer: the trainer.
            pl_module: the module being validated.
        """

    # -- resume: the schedule continues where the checkpoint left it ------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"fit_passes": self.fit_passes}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.fit_passes = int(state_dict.get("fit_passes", 0))

    def _close_pipes(self) -> None:
        """Release every pipe's workers: a pass Lightning cut short (the sanity check, ``limit_val_batches``,
        an error) never reaches the end that would release them, and they would idle through training."""
        for pipe in self._loaders.pipes if self._loaders is not None else ():
            pipe.close()

    def _drop_guard(self) -> None:
        if self._guard is not None:
            self._guard.remove()
            self._guard = None
