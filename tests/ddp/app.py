"""A tiny Lightning app over episodepipes: model, DataModule, a counters callback, and a DDP entry point.

The unit tests import the classes; tests/ddp/test_ddp_fit.py runs ``main()`` as a script under DDP
(Lightning re-runs this script for rank 1). Module-level classes, so everything pickles.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import time
from datetime import timedelta
from pathlib import Path

import lightning.pytorch as pl
import torch

from episodepipes.lightning_glue import OverlayVideoWriter, ValLoaders
from episodepipes.pipes import metric_pipe, video_pipe

CAMERA = "front"


def features(img: torch.Tensor) -> torch.Tensor:
    """uint8 [B, 3, H, W] -> per-channel means in [0, 1], [B, 3]."""
    return img.float().mean(dim=(2, 3)) / 255.0


def target(batch: dict) -> torch.Tensor:
    """The end-effector's normalised position, [B, 2]."""
    h, w = batch[CAMERA].shape[2:]
    return batch["keypoints"][:, 0, :].float() / torch.tensor([w, h], dtype=torch.float32)


class TinyModel(pl.LightningModule):
    """Predicts the end-effector position from mean colours; logs an L1 error from metric loaders only."""

    def __init__(self, log_from_video: bool = False) -> None:
        super().__init__()
        self.head = torch.nn.Linear(3, 2)
        self.log_from_video = log_from_video

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        return self.head(features(img))

    def training_step(self, batch: tuple, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.l1_loss(self.head(x), y)

    def validation_step(self, batch: dict, batch_idx: int, dataloader_idx: int = 0) -> dict:
        pred = self(batch[CAMERA])
        loaders = self.trainer.val_dataloaders
        if loaders.is_video(dataloader_idx):
            if self.log_from_video:
                self.log("val/oops", 1.0)
            h, w = batch[CAMERA].shape[2:]
            px = pred * torch.tensor([w, h])
            return {"points": px[:, None, :], "trajectories": torch.stack([px, px + 5.0], 1)}
        err = (pred - target(batch)).abs().sum(1)
        valid = batch["valid"]
        n = int(valid.sum())
        # Sums, not a batch_size-weighted mean: Lightning 2.6 mean-syncs its int64 batch-size accumulator, which
        # floors when ranks hold different numbers of valid samples (a padded split) - Lightning issue #21859.
        self.log("val/err_sum", err[valid].sum(), reduce_fx="sum", sync_dist=True, add_dataloader_idx=False)
        self.log("val/count", float(n), reduce_fx="sum", sync_dist=True, add_dataloader_idx=False)
        return {}

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class EpisodeData(pl.LightningDataModule):
    """Random train tensors; val from the shards: one metric pipe and one pinned video pipe."""

    def __init__(self, root: str, *, pinned: list[str], frames_per_episode: int = 5, batch_size: int = 4,
                 video_batch: int = 6, max_batches: int = 4, method: str = "thread", num_workers: int = 1) -> None:
        super().__init__()
        self.root, self.pinned, self.k, self.bs = root, pinned, frames_per_episode, batch_size
        self.video_batch, self.max_batches = video_batch, max_batches
        self.method, self.num_workers = method, num_workers
        self.loaders: ValLoaders | None = None

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        g = torch.Generator().manual_seed(0)
        x = torch.rand(16, 3, generator=g)
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x[:, :2]), batch_size=4)

    def val_dataloader(self) -> ValLoaders:
        self.loaders = ValLoaders(
            metrics={"val": metric_pipe(self.root, frames_per_episode=self.k, batch_size=self.bs, num_workers=1)},
            videos={"pinned": video_pipe(self.root, episodes=self.pinned, batch_size=self.video_batch,
                                         max_batches=self.max_batches, method=self.method,
                                         num_workers=self.num_workers)},
        )
        return self.loaders


class PassCounters(pl.Callback):
    """Per validation pass: the video and metric pipes' counters on this rank (a list of dicts)."""

    def __init__(self) -> None:
        self.passes: list[dict] = []

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        loaders = trainer.val_dataloaders
        self.passes.append({
            "fn": str(trainer.state.fn.value), "sanity": trainer.sanity_checking, "step": trainer.global_step,
            "video": dict(loaders.videos["pinned"].stats), "metric": dict(loaders.metrics["val"].stats),
        })


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("root")
    p.add_argument("out")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--every", type=int, default=2)
    p.add_argument("--timeout", type=float, default=60)
    a = p.parse_args()
    faulthandler.dump_traceback_later(2 * a.timeout, exit=True)  # a hang shows where, then ends this rank
    torch.set_num_threads(1)
    pl.seed_everything(0, verbose=False)
    out = Path(a.out)
    writer = OverlayVideoWriter(out / "videos", every_n_passes=a.every, pg_timeout=timedelta(seconds=a.timeout))
    counters = PassCounters()
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, strategy=pl.strategies.DDPStrategy(timeout=timedelta(seconds=a.timeout)),
        max_epochs=a.epochs, num_sanity_val_steps=2, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[writer, counters],
    )
    model = TinyModel()
    dm = EpisodeData(a.root, pinned=["ep0000", "ep0003"], method="process", num_workers=1)
    trainer.fit(model, datamodule=dm)
    fit = {k: float(trainer.callback_metrics[f"val/{k}"]) for k in ("err_sum", "count")}
    results = trainer.validate(model, datamodule=dm, verbose=False)[0]
    rank = trainer.global_rank
    if rank == 0:
        torch.save(model.state_dict(), out / "model.pt")
    record = {"rank": rank, "world_size": trainer.world_size, "passes": counters.passes, "fit": fit,
              "validate": {k: float(results[f"val/{k}"]) for k in ("err_sum", "count")},
              "written": [str(x) for x in writer.written], "fit_passes": writer.fit_passes, "pid": os.getpid()}
    (out / f"rank{rank}.json").write_text(json.dumps(record, indent=1))
    # Lightning leaves the process group up after fit(); tearing it down before exit stops gloo's threads
    # from outliving the interpreter (a joinable C++ thread at exit aborts with std::terminate).
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    _forced_exit(rank, out)


def _forced_exit(rank: int, out: Path) -> None:
    """Test hook: ``EPISODEPIPES_TEST_LATE_EXIT=<rank>:<status>`` makes that rank exit with that status once
    rank 0 has written its record, as a rank that dies at interpreter exit after rank 0 finished would."""
    spec = os.environ.get("EPISODEPIPES_TEST_LATE_EXIT")
    if not spec or int(spec.split(":")[0]) != rank:
        return
    while not (out / "rank0.json").exists():
        time.sleep(0.1)
    time.sleep(3)  # rank 0 exits in well under this once its record is written
    os._exit(int(spec.split(":")[1]))


if __name__ == "__main__":
    main()
