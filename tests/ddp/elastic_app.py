"""Train a tiny model on a train_pipe for some steps, saving a checkpoint, or resume one at another world size.

tests/ddp/test_ddp_elastic.py runs this script under `run_ranks`: once with 2 ranks (Lightning's DDP over
gloo) that stops and checkpoints, then with 1 rank and twice the batch size (or, with ``--on-resize``, another
global batch) that resumes the checkpoint.
Each rank writes the (episode, frame) of every sample it trained on, batch by batch, to ``rank<r>.json``.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
from datetime import timedelta
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from episodepipes.pipes.train import train_pipe


class Recorder(pl.LightningModule):
    def __init__(self, root: str, batch_size: int, **pipe: object) -> None:
        super().__init__()
        self.lin, self.root, self.batch_size, self.seen = torch.nn.Linear(7, 1), root, batch_size, []
        self.pipe = pipe  # train_pipe's shuffle= and on_resize= options

    def training_step(self, batch: dict, i: int) -> torch.Tensor:
        self.seen.append(list(zip(batch["episode"], batch["frame"].tolist())))
        return self.lin(batch["state"]).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self):
        # rank and world size from torch.distributed: the group is up when Lightning calls this
        return train_pipe(self.root, batch_size=self.batch_size, seed=2, num_workers=1, **self.pipe)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("root")
    p.add_argument("out")
    p.add_argument("--devices", type=int, required=True)
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--stop", type=int, default=-1, help="max_steps, checkpointed there")
    p.add_argument("--ckpt", default=None, help="resume this checkpoint")
    p.add_argument("--shuffle", default="full", help="train_pipe's shuffle= (block orders: blocks of 4, windows of 2)")
    p.add_argument("--on-resize", default="refuse", help="train_pipe's on_resize=")
    a = p.parse_args()
    faulthandler.dump_traceback_later(120, exit=True)  # a hang shows where, then ends this rank
    torch.set_num_threads(1)
    out = Path(a.out)
    strategy = pl.strategies.DDPStrategy(timeout=timedelta(seconds=60)) if a.devices > 1 else "auto"
    callbacks = [ModelCheckpoint(dirpath=out / "ckpt", every_n_train_steps=a.stop, save_top_k=-1)] if a.stop > 0 else []
    trainer = pl.Trainer(accelerator="cpu", devices=a.devices, strategy=strategy, max_epochs=a.epochs,
                         max_steps=a.stop, logger=False, enable_checkpointing=bool(callbacks), callbacks=callbacks,
                         enable_progress_bar=False, enable_model_summary=False)
    blocks = {} if a.shuffle == "full" else {"block_frames": 4, "window_blocks": 2}
    model = Recorder(a.root, a.batch, shuffle=a.shuffle, on_resize=a.on_resize, **blocks)
    trainer.fit(model, ckpt_path=a.ckpt)
    rank = trainer.global_rank
    (out / f"rank{rank}.json").write_text(json.dumps({"world_size": trainer.world_size, "seen": model.seen}))
    if torch.distributed.is_initialized():  # before exit, so gloo's threads do not outlive the interpreter
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
