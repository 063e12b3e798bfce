"""The demo's training run: a 2-process DDP fit on CPU with a metric pipe and a gated pinned video pipe.

``scripts/demo.py`` starts it once per rank (`episodepipes.lightning_glue.launch.run_ranks` sets
``LOCAL_RANK`` and the rendezvous variables, so Lightning starts no process itself) and checks every
rank's exit status. Each rank appends one JSON line per validation
pass to ``<out>/passes-rank<r>.jsonl``: gate state, frames decoded, bytes read and seconds, read from
the pipes' own counters. ``scripts/demo.py`` prints them as a table.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import logging
import time
import warnings
from datetime import timedelta
from pathlib import Path

import lightning.pytorch as pl
import torch
import torchmetrics
from lightning.pytorch.strategies import DDPStrategy

from episodepipes.lightning_glue import OverlayVideoWriter, ValLoaders
from episodepipes.pipes import EpisodeIndex, metric_pipe, video_pipe
from episodepipes.pipes.train import train_pipe

TIMEOUT = timedelta(seconds=90)


class ShardData(pl.LightningDataModule):
    """An ordinary DataModule: only val_dataloader() knows about gates, through ValLoaders."""

    def __init__(self, shards: Path, pinned: list[str], val_split: str) -> None:
        super().__init__()
        self.index = EpisodeIndex.open(shards)
        self.pinned, self.val_split = pinned, val_split

    def train_dataloader(self):
        return train_pipe(self.index, batch_size=16, seed=0, num_workers=2)

    def val_dataloader(self):
        return ValLoaders(
            metrics={"val": metric_pipe(self.index, split=self.val_split, frames_per_episode=12, batch_size=16,
                                        num_workers=2)},
            videos={"pinned": video_pipe(self.index, episodes=self.pinned, batch_size=20, max_batches=50,
                                         method="process", num_workers=1)},
        )


class KeypointNet(pl.LightningModule):
    """Predicts the tracked point (pixels) from one camera; small enough to train on CPU in seconds."""

    def __init__(self, camera: str) -> None:
        super().__init__()
        self.camera = camera
        self.val_err = torchmetrics.MeanMetric()
        self.net = torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 5, stride=2), torch.nn.ReLU(), torch.nn.Conv2d(16, 32, 3, stride=2),
            torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(4), torch.nn.Flatten(), torch.nn.Linear(512, 2))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        h, w = images.shape[-2:]
        return torch.sigmoid(self.net(images.float() / 255)) * images.new_tensor([w, h], dtype=torch.float32)

    def _loss(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        pred = self(batch[self.camera])
        h, w = batch[self.camera].shape[-2:]
        # user data without a "keypoints" array: regress the image centre, the pipeline story is the same
        target = batch["keypoints"][:, 0].float() if "keypoints" in batch else pred.new_tensor([w / 2, h / 2])
        err = ((pred - target) ** 2).sum(-1)
        return pred, err

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        return self._loss(batch)[1].mean() / 100

    def validation_step(self, batch: dict, batch_idx: int, dataloader_idx: int = 0) -> dict | None:
        pred, err = self._loss(batch)
        if self.trainer.val_dataloaders.is_video(dataloader_idx):
            return {"points": pred}  # drawn by OverlayVideoWriter; video loaders log nothing (DDP invariant)
        # MeanMetric syncs sums and counts, so padded samples (valid=False) leave the metric exact under DDP.
        self.val_err.update(err[batch["valid"]].sqrt())
        self.log("val/px_err", self.val_err, add_dataloader_idx=False)
        return None

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=3e-3)


class PassRecorder(pl.Callback):
    """Per validation pass and rank: gate state, frames decoded, bytes read, seconds (from pipe.stats)."""

    def __init__(self, out: Path) -> None:
        self.out, self.passes = out, 0

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        loaders: ValLoaders = trainer.val_dataloaders
        self.t0 = self.t_metrics_done = time.perf_counter()
        self.before = {n: dict(p.stats) for n, p in {**loaders.metrics, **loaders.videos}.items()}

    def on_validation_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: object,
                                batch: object, batch_idx: int, dataloader_idx: int = 0) -> None:
        if not trainer.val_dataloaders.is_video(dataloader_idx):
            self.t_metrics_done = time.perf_counter()  # video loaders come last: the rest is theirs

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        loaders: ValLoaders = trainer.val_dataloaders
        now = time.perf_counter()
        row = {"rank": trainer.global_rank, "pass": self.passes, "sanity": trainer.sanity_checking,
               "seconds": round(now - self.t0, 3), "video_seconds": round(now - self.t_metrics_done, 3)}
        for name, pipe in {**loaders.metrics, **loaders.videos}.items():
            d = {k: pipe.stats[k] - self.before[name][k] for k in pipe.stats}
            row[name] = {k: d[k] for k in ("frames_decoded", "bytes_read", "workers_started")}
            if pipe.gate is not None:
                row[name]["gate"] = "open" if d["open_passes"] else "closed"
        with open(self.out / f"passes-rank{trainer.global_rank}.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
        self.passes += 0 if trainer.sanity_checking else 1


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shards", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--every", type=int, default=2)
    args = ap.parse_args()
    faulthandler.enable()  # a native crash (SIGABRT/SIGSEGV) in a rank dumps its Python stacks into fit.log
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    index = EpisodeIndex.open(args.shards)
    val_split = "val" if index.split("val") else index.episodes[0].split
    val = index.split(val_split)
    camera = next(iter(val[0].cameras))
    pinned = [e.id for e in val[:2]]
    # every camera side by side; the ground truth (when the data has keypoints) beside the prediction
    gt_key = "keypoints" if "keypoints" in val[0].arrays else None
    writer = OverlayVideoWriter(args.out / "videos", cameras=list(val[0].cameras), gt_key=gt_key,
                                every_n_passes=args.every, pg_timeout=TIMEOUT)
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, strategy=DDPStrategy(process_group_backend="gloo", timeout=TIMEOUT),
        max_epochs=args.epochs, limit_train_batches=8, num_sanity_val_steps=1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[writer, PassRecorder(args.out)], use_distributed_sampler=False)
    trainer.fit(KeypointNet(camera), datamodule=ShardData(args.shards, pinned, val_split))
    if trainer.is_global_zero:
        (args.out / "videos.json").write_text(json.dumps([str(p) for p in writer.written]))
        (args.out / "pinned.json").write_text(json.dumps(pinned))
        metric = trainer.callback_metrics.get("val/px_err")
        (args.out / "metric.json").write_text(json.dumps({"val/px_err": float(metric) if metric is not None else None}))
    # Lightning leaves the process group up after fit(); tearing it down before exit stops gloo's threads
    # from outliving the interpreter (a joinable C++ thread at exit aborts with std::terminate).
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
