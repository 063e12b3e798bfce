# Plug episodepipes into an existing LightningDataModule: val_dataloader() returns ValLoaders, plus one callback.
from datetime import timedelta

import lightning.pytorch as pl
import torchmetrics

from episodepipes.lightning_glue import OverlayVideoWriter, ValLoaders
from episodepipes.pipes import metric_pipe, video_pipe


class MyData(pl.LightningDataModule):  # your DataModule: only val_dataloader() changes
    def val_dataloader(self) -> ValLoaders:  # metric loaders first, video loaders last; lengths known up front
        return ValLoaders(metrics={"val": metric_pipe("shards/", frames_per_episode=8, batch_size=32)},
                          videos={"pinned": video_pipe("shards/", episodes=["ep0002", "ep0005"], batch_size=16,
                                                       max_batches=20)})  # a cap is required


class MyModel(pl.LightningModule):  # your model, plus a MeanMetric: exact under DDP
    def __init__(self) -> None:
        super().__init__()
        self.val_err = torchmetrics.MeanMetric()

    def validation_step(self, batch: dict, batch_idx: int, dataloader_idx: int = 0) -> dict:
        pred = self(batch["front"])  # [B, N, 2] keypoints in pixels
        if self.trainer.val_dataloaders.is_video(dataloader_idx):  # rank 0, render passes only
            return {"points": pred}  # drawn on the video; never self.log here (it raises: DDP deadlock)
        self.val_err.update((pred - batch["keypoints"]).norm(dim=-1).mean(-1)[batch["valid"]])  # skip padding
        self.log("val/err", self.val_err, add_dataloader_idx=False)
        return {}


timeout = timedelta(minutes=10)  # every_n_passes (N) is set here, on the writer, and nowhere else
writer = OverlayVideoWriter("videos/", every_n_passes=10, pg_timeout=timeout)  # rank 0, atomic mp4s
pl.Trainer(devices=2, strategy=pl.strategies.DDPStrategy(timeout=timeout), callbacks=[writer]).fit(MyModel(), MyData())
