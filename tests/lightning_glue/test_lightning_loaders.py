import threading

import lightning.pytorch as pl
import pytest
from ddp.app import EpisodeData, TinyModel
from helpers import make_shards

from episodepipes.lightning_glue import ValLoaders
from episodepipes.pipes import metric_pipe, video_pipe


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return str(make_shards(tmp_path_factory.mktemp("loaders") / "s", num_episodes=9, length=12, height=32, width=48))


def _trainer(**kw):
    return pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, **kw)


def _untouched(pipe):
    return all(pipe.stats[k] == 0 for k in ("bytes_read", "frames_decoded", "workers_started", "open_passes"))


def test_names_map_to_dataloader_indices_videos_last(root):
    m1 = metric_pipe(root, frames_per_episode=3, batch_size=4)
    m2 = metric_pipe(root, frames_per_episode=2, batch_size=2)
    v = video_pipe(root, episodes=["ep0000"], batch_size=4, max_batches=2)
    loaders = ValLoaders(metrics={"val": m1, "val_small": m2}, videos={"pinned": v})
    assert loaders.names == ["val", "val_small", "pinned"]
    assert [loaders.is_video(i) for i in range(3)] == [False, False, True]
    assert [loaders.name(i) for i in range(3)] == loaders.names
    assert loaders.pipe(2) is v and loaders.pipe(0) is m1 and loaders.index_of("pinned") == 2
    with pytest.raises(IndexError, match="dataloader_idx=3"):
        loaders.is_video(3)
    with pytest.raises(KeyError, match="no loader named 'nope'"):
        loaders.index_of("nope")


def test_lengths_come_from_the_plan_without_an_iterator(root):
    before = threading.active_count()
    m = metric_pipe(root, frames_per_episode=5, batch_size=4)
    v = video_pipe(root, episodes=["ep0000", "ep0001"], batch_size=5, max_batches=10, method="process")
    loaders = ValLoaders(metrics={"val": m}, videos={"pinned": v})
    assert loaders.lengths() == [4, 5]  # ceil(3 val episodes * 5 / 4); ceil(24 / 5)
    assert _untouched(m) and _untouched(v) and threading.active_count() == before


def test_lengths_are_the_same_on_every_rank_even_for_a_padded_split(root):
    lengths = {
        r: ValLoaders(metrics={"val": metric_pipe(root, frames_per_episode=5, batch_size=4, rank=r, world_size=2)},
                      videos={"v": video_pipe(root, episodes=["ep0000"], batch_size=4, max_batches=2)}).lengths()
        for r in (0, 1)
    }
    assert lengths[0] == lengths[1] == [2, 2]  # 15 frames: 8 + (7 + 1 padded) per rank


def test_uncapped_video_pipe_is_refused(root):
    with pytest.raises(ValueError, match="max_batches=None.*process-group"):
        ValLoaders(videos={"pinned": video_pipe(root, episodes=["ep0000"], batch_size=4, max_batches=None)})


def test_bad_inputs_name_the_fix(root):
    m = metric_pipe(root, frames_per_episode=2, batch_size=4)
    with pytest.raises(ValueError, match="at least one pipe"):
        ValLoaders(metrics={}, videos=None)
    with pytest.raises(ValueError, match="no gate.*video_pipe"):
        ValLoaders(videos={"pinned": m})
    with pytest.raises(ValueError, match=r"\['a'\].*both"):
        ValLoaders(metrics={"a": m}, videos={"a": video_pipe(root, episodes=["ep0000"], batch_size=4,
                                                              max_batches=1)})
    with pytest.raises(TypeError, match="mapping of name"):
        ValLoaders(metrics=[m])
    with pytest.raises(TypeError, match="sized iterable"):
        ValLoaders(metrics={"a": object()})


class _Seen(pl.Callback):
    def __init__(self):
        self.batches = {}

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        if not trainer.sanity_checking:
            self.batches[dataloader_idx] = self.batches.get(dataloader_idx, 0) + 1


def test_lightning_takes_each_pipe_as_one_loader(root):
    dm = EpisodeData(root, pinned=["ep0000", "ep0001"], video_batch=5, max_batches=10)
    seen = _Seen()
    trainer = _trainer(max_epochs=1, num_sanity_val_steps=0, callbacks=[seen])
    trainer.fit(TinyModel(), datamodule=dm)
    relied_on = ("ValLoaders relies on Lightning flattening val_dataloader()'s return through torch's pytree registry "
                 "(a torch.export.register_dataclass dataclass -> one loader per pipe, the object given back as "
                 "trainer.val_dataloaders); this Lightning release does not: see lightning_glue/loaders.py")
    assert isinstance(trainer.val_dataloaders, ValLoaders), relied_on
    assert trainer.val_dataloaders.names == ["val", "pinned"]
    assert seen.batches == {0: 4, 1: 5}, relied_on  # no gate bound (no RenderGate): the video pipe is open


def test_an_empty_group_is_not_taken_for_a_loader(root):
    loaders = ValLoaders(metrics={}, videos={"pinned": video_pipe(root, episodes=["ep0000"], batch_size=4,
                                                                   max_batches=2)})
    assert loaders.metrics is None and loaders.names == ["pinned"]
    seen = _Seen()
    model = TinyModel()
    model.val_dataloader = lambda: loaders
    _trainer(callbacks=[seen]).validate(model, verbose=False)
    assert seen.batches == {0: 2}
