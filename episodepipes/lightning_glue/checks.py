"""Fail-fast checks for the DDP invariant: video loaders log nothing, render passes stay inside the timeout.

Public Lightning API only, with one undocumented behaviour relied on (in `ValLoaders`, not here):
Lightning flattens what ``val_dataloader()`` returns with torch's pytree registry, so a dataclass
registered with ``torch.export.register_dataclass`` becomes one loader per field value.
``tests/lightning_glue/test_lightning_loaders.py::test_lightning_takes_each_pipe_as_one_loader`` fails, naming that
behaviour, if a Lightning release changes it. The logging guard shadows the
module's public ``log`` method with an instance attribute for the span of one video batch (``log_dict``
goes through ``log``), and removes it afterwards.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import lightning.pytorch as pl
import torch

from episodepipes.lightning_glue.loaders import ValLoaders

log = logging.getLogger(__name__)

DEADLOCK = (
    "Video loaders run on rank 0 only (their gate is closed on the other ranks), so ranks draw different "
    "numbers of batches from them. Under DDP a log there deadlocks: with sync_dist=True and on_step=True the "
    "all_reduce inside self.log waits for ranks that never call it; with on_epoch=True the epoch-end "
    "collectives pair up with the wrong partners. Log from metric loaders only: in validation_step, return "
    "early (after computing what the overlay needs) when loaders.is_video(dataloader_idx)."
)


def check_same_lengths(loaders: ValLoaders, pl_module: pl.LightningModule) -> None:
    """Raise on every rank alike if any loader's length differs between ranks (a collective: call on all ranks)."""
    mine = torch.tensor(loaders.lengths(), dtype=torch.int64)
    if pl_module.trainer.world_size <= 1:
        return
    every = pl_module.all_gather(mine).reshape(-1, len(mine)).cpu()
    bad = [n for i, n in enumerate(loaders.names) if len(set(every[:, i].tolist())) > 1]
    if bad:
        per = {n: every[:, loaders.index_of(n)].tolist() for n in bad}
        raise RuntimeError(f"loader lengths differ between ranks {per}: a metric loader must yield the same number "
                           "of batches on every rank; build it with metric_pipe(), which pads the split")


class LogGuard:
    """While installed, any ``pl_module.log(...)`` raises, naming the video loader and the deadlock."""

    def __init__(self, pl_module: pl.LightningModule, loader: str, dataloader_idx: int) -> None:
        self.pl_module, self.loader, self.dataloader_idx = pl_module, loader, dataloader_idx
        pl_module.log = self.refuse  # type: ignore[method-assign]  # instance attribute shadows the method

    def refuse(self, name: str, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError(f"self.log({name!r}) was called while processing a batch of video loader "
                           f"{self.loader!r} (dataloader_idx={self.dataloader_idx}). {DEADLOCK}")

    def remove(self) -> None:
        if vars(self.pl_module).get("log") == self.refuse:
            del self.pl_module.log


def pg_timeout(trainer: pl.Trainer, explicit: timedelta | None) -> timedelta | None:
    """The process-group timeout to compare render passes with: ``explicit``, else torch's default under DDP.

    Lightning's strategies keep the timeout in a private attribute, so it is not read from there.
    """
    if explicit is not None:
        return explicit
    if trainer.world_size > 1:
        from torch.distributed.constants import default_pg_timeout

        return default_pg_timeout
    return None


def report_render_duration(seconds: float, timeout: timedelta | None, *, step: int) -> None:
    """Log a render pass's duration; warn when it exceeds half the process-group timeout."""
    log.info("render pass at global step %d took %.2f s (video loaders and writing, rank 0)", step, seconds)
    if timeout is not None and seconds > timeout.total_seconds() / 2:
        log.warning("render pass at global step %d took %.1f s, more than half the process-group timeout (%s): "
                    "the other ranks wait that long in their next collective. Lower the video pipe's max_batches, "
                    "pin fewer episodes, or raise DDPStrategy(timeout=...) and RenderGate(pg_timeout=...).",
                    step, seconds, timeout)
