"""OverlayVideoWriter renders a names="lerobot" video pipe: cameras= and gt_key= stay the index's names (the
writer sees the batch with those names added, `with_index_names`)."""

from types import SimpleNamespace as NS

import lightning.pytorch as pl
import numpy as np
import torch

from benchmarks.lerobot_data import make_lerobot
from episodepipes.lightning_glue import OverlayVideoWriter, ValLoaders
from episodepipes.lightning_glue.overlay import with_index_names
from episodepipes.lightning_glue.video_writer import read_rgb
from episodepipes.pipes import video_pipe
from episodepipes.sharding import WriteOptions, open_reader, write_shards


class _Data(pl.LightningDataModule):
    def __init__(self, root):
        super().__init__()
        self.root = root

    def val_dataloader(self):
        return ValLoaders(videos={"pinned": video_pipe(self.root, episodes=["episode_000001"], batch_size=4,
                                                       max_batches=10, num_workers=1, names="lerobot",
                                                       delta_timestamps={"observation.state": [0.0, 0.1, 0.2]})})


class _Policy(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.seen = []
        self.w = torch.nn.Parameter(torch.zeros(1))

    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        self.seen.append(sorted(batch))
        return {"points": batch["observation.state"][:, 0, :2] * 0 + 8}


def test_a_lerobot_named_video_pipe_renders_with_the_index_name_of_its_camera(tmp_path):
    make_lerobot(tmp_path / "lr", lengths=(6, 7), num_episodes=2, height=32, width=48)
    write_shards(open_reader(tmp_path / "lr", "lerobot"), tmp_path / "shards", WriteOptions(format="lerobot"))
    writer = OverlayVideoWriter(tmp_path / "v", every_n_passes=1, camera="observation_images_wrist", log_to=None)
    model = _Policy()
    pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
               callbacks=[writer]).validate(model, datamodule=_Data(tmp_path / "shards"), verbose=False)
    assert "observation.state_is_pad" in model.seen[0] and "observation_state" not in model.seen[0]
    assert [p.name for p in writer.written] == ["episode_000001_step00000000_validate.mp4"]
    assert read_rgb(writer.written[0]).shape == (7, 32, 48, 3)


def test_with_index_names_adds_aliases_and_keeps_what_the_batch_has():
    ep = NS(cameras={"cam_top": NS(source="cam.top")}, arrays={"action": NS(source="action"), "s": NS(source="s.x")})
    top, act, pad = torch.zeros(2, 3, 4, 4), torch.ones(2, 3), torch.tensor([[False, True]] * 2)
    got = with_index_names({"cam.top": top, "action": act, "action_is_pad": pad}, ep)
    assert got["cam_top"] is top and got["action"] is act and got["action_pad"] is pad and "s" not in got
    assert np.array_equal(sorted(got), sorted(["cam.top", "cam_top", "action", "action_is_pad", "action_pad"]))
