import logging
from datetime import timedelta
from types import SimpleNamespace

import lightning.pytorch as pl
import pytest
import torch
from ddp.app import EpisodeData, TinyModel
from helpers import make_shards

from episodepipes.lightning_glue import OverlayVideoWriter, RenderGate, ValLoaders
from episodepipes.lightning_glue.checks import check_same_lengths, pg_timeout, report_render_duration


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return str(make_shards(tmp_path_factory.mktemp("checks") / "s", num_episodes=6, length=12, height=32, width=48))


def _trainer(callbacks, **kw):
    return pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks, **kw)


def test_log_from_a_video_batch_raises_on_the_first_batch(root):
    dm = EpisodeData(root, pinned=["ep0000", "ep0001"], video_batch=4)
    model = TinyModel(log_from_video=True)
    with pytest.raises(RuntimeError, match=r"self.log\('val/oops'\).*video loader 'pinned'.*deadlock"):
        _trainer([RenderGate(every_n_passes=1)]).validate(model, datamodule=dm, verbose=False)
    assert dm.loaders.videos["pinned"].stats["batches"] == 1
    assert "log" not in vars(model)  # the guard is removed on the exception too


def test_log_from_a_video_batch_raises_in_a_fit_too(root):
    dm = EpisodeData(root, pinned=["ep0000"])
    with pytest.raises(RuntimeError, match="Log from metric loaders only"):
        _trainer([RenderGate(every_n_passes=1)], max_epochs=1, num_sanity_val_steps=0).fit(
            TinyModel(log_from_video=True), datamodule=dm)


def test_metric_loaders_log_freely_and_the_guard_is_gone_afterwards(root, tmp_path):
    model = TinyModel()
    results = _trainer([OverlayVideoWriter(tmp_path, every_n_passes=1)]).validate(
        model, datamodule=EpisodeData(root, pinned=["ep0000"]), verbose=False)
    assert results[0]["val/count"] == 10  # 2 val episodes x 5 frames
    assert "log" not in vars(model)


def test_render_duration_warns_past_half_the_timeout(caplog):
    with caplog.at_level(logging.INFO, logger="episodepipes"):
        report_render_duration(4.0, timedelta(seconds=10), step=3)
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
        report_render_duration(6.0, timedelta(seconds=10), step=4)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "global step 4" in warnings[0] and "max_batches" in warnings[0]


def test_a_slow_render_pass_warns_through_the_callback(root, tmp_path, caplog):
    writer = OverlayVideoWriter(tmp_path, every_n_passes=1, pg_timeout=timedelta(microseconds=1))
    with caplog.at_level(logging.WARNING, logger="episodepipes"):
        _trainer([writer]).validate(TinyModel(), datamodule=EpisodeData(root, pinned=["ep0000"]), verbose=False)
    assert any("more than half the process-group timeout" in r.getMessage() for r in caplog.records)


def test_pg_timeout_explicit_wins_and_single_process_has_none():
    trainer = SimpleNamespace(world_size=1)
    assert pg_timeout(trainer, None) is None
    assert pg_timeout(trainer, timedelta(seconds=5)) == timedelta(seconds=5)
    assert pg_timeout(SimpleNamespace(world_size=2), None) == timedelta(minutes=30)


class _FakeModule:
    """all_gather as under DDP with 2 ranks, where rank 1 has one batch fewer in loader 'val'."""

    trainer = SimpleNamespace(world_size=2)

    def all_gather(self, t):
        other = t.clone()
        other[0] -= 1
        return torch.stack([t, other])


def test_lengths_that_differ_between_ranks_are_refused(root):
    from episodepipes.pipes import metric_pipe, video_pipe

    loaders = ValLoaders(metrics={"val": metric_pipe(root, frames_per_episode=5, batch_size=4)},
                         videos={"v": video_pipe(root, episodes=["ep0000"], batch_size=4, max_batches=2)})
    with pytest.raises(RuntimeError, match=r"differ between ranks \{'val': \[3, 2\]\}.*metric_pipe"):
        check_same_lengths(loaders, _FakeModule())


def test_other_val_dataloaders_get_one_warning(root, caplog):
    from episodepipes.pipes import metric_pipe

    model = TinyModel()
    model.val_dataloader = lambda: [metric_pipe(root, frames_per_episode=2, batch_size=4)]
    model.validation_step = lambda batch, batch_idx: None
    with caplog.at_level(logging.WARNING, logger="episodepipes"):
        trainer = _trainer([RenderGate()])
        trainer.validate(model, verbose=False)
        trainer.validate(model, verbose=False)
    assert len([r for r in caplog.records if "not ValLoaders" in r.getMessage()]) == 1
