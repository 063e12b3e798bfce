import lightning.pytorch as pl
import pytest
from ddp.app import EpisodeData, PassCounters, TinyModel
from helpers import make_shards
from lightning.pytorch.callbacks import ModelCheckpoint

from episodepipes.lightning_glue import RenderGate, is_render_pass
from episodepipes.pipes import video_pipe

FRAMES = 2 * 12 * 2  # two pinned episodes of 12 frames, two cameras


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return str(make_shards(tmp_path_factory.mktemp("gating") / "s", num_episodes=6, length=12, height=32, width=48))


def _trainer(callbacks, **kw):
    kw = {"max_epochs": 4, "num_sanity_val_steps": 2, **kw}
    return pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks, **kw)


def _opened(counters):
    """Per validation pass: was the video gate open, and how many frames did it decode (counters restart on reload)."""
    out, prev, fn = [], {}, None
    for p in counters.passes:
        prev = prev if p["fn"] == fn else {}
        fn, v = p["fn"], p["video"]
        out.append((v["open_passes"] - prev.get("open_passes", 0), v["frames_decoded"] - prev.get("frames_decoded", 0)))
        prev = v
    return out


@pytest.mark.parametrize(("kw", "expected"), [
    ({"global_rank": 1, "fn": "fit", "sanity_checking": False, "fit_pass": 2}, False),
    ({"global_rank": 1, "fn": "validate", "sanity_checking": False, "fit_pass": 0}, False),
    ({"global_rank": 0, "fn": "fit", "sanity_checking": True, "fit_pass": 0}, False),
    ({"global_rank": 0, "fn": "fit", "sanity_checking": True, "fit_pass": 0, "render_sanity_check": True}, True),
    ({"global_rank": 0, "fn": "fit", "sanity_checking": False, "fit_pass": 1}, False),
    ({"global_rank": 0, "fn": "fit", "sanity_checking": False, "fit_pass": 2}, True),
    ({"global_rank": 0, "fn": "fit", "sanity_checking": False, "fit_pass": 0}, False),
    ({"global_rank": 0, "fn": "validate", "sanity_checking": False, "fit_pass": 0}, True),
    ({"global_rank": 0, "fn": "test", "sanity_checking": False, "fit_pass": 2}, False),
])
def test_render_rule(kw, expected):
    assert is_render_pass(every_n_passes=2, **kw) is expected


def test_every_n_must_be_positive():
    for bad in (0, -1, 1.5, True, None):
        with pytest.raises(ValueError, match="every_n_passes"):
            RenderGate(every_n_passes=bad)


def test_fit_opens_every_nth_pass_only_and_not_in_the_sanity_check(root):
    gate, counters = RenderGate(every_n_passes=2), PassCounters()
    _trainer([gate, counters]).fit(TinyModel(), datamodule=EpisodeData(root, pinned=["ep0000", "ep0001"]))
    # sanity, pass 1, pass 2, pass 3, pass 4. Lightning's throwaway iter() at setup counted nothing.
    assert _opened(counters) == [(0, 0), (0, 0), (1, FRAMES), (0, 0), (1, FRAMES)]
    assert gate.fit_passes == 4 and gate.render_passes == 2
    assert [p["video"]["workers_started"] for p in counters.passes] == [0, 0, 1, 1, 2]


def test_sanity_check_renders_when_asked(root):
    gate, counters = RenderGate(every_n_passes=3, render_sanity_check=True), PassCounters()
    _trainer([gate, counters], max_epochs=3).fit(TinyModel(), datamodule=EpisodeData(root, pinned=["ep0000"]))
    assert [o for o, _ in _opened(counters)] == [1, 0, 0, 1]


def test_validate_renders_and_fit_passes_stay_counted(root):
    gate, counters = RenderGate(every_n_passes=5), PassCounters()
    trainer = _trainer([gate, counters], max_epochs=2)
    dm = EpisodeData(root, pinned=["ep0000", "ep0001"])
    trainer.fit(TinyModel(), datamodule=dm)
    trainer.validate(TinyModel(), datamodule=dm, verbose=False)
    assert _opened(counters) == [(0, 0), (0, 0), (0, 0), (1, FRAMES)]
    assert gate.fit_passes == 2


def test_without_a_trainer_the_gate_is_open(root):
    gate = RenderGate(every_n_passes=1000)
    assert gate.should_render() is True
    dm = EpisodeData(root, pinned=["ep0000"])
    _trainer([gate], max_epochs=1).fit(TinyModel(), datamodule=dm)
    pipe = dm.loaders.videos["pinned"]
    assert pipe.stats["open_passes"] == 0  # closed on both passes of the fit
    assert len(list(pipe)) == len(pipe) == 2  # after teardown: unbound, a plain open iterable again
    fresh = video_pipe(root, episodes=["ep0001"], batch_size=6, max_batches=1)
    assert len(list(fresh)) == 1


def test_resume_continues_the_schedule(root, tmp_path):
    ckpt = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    gate = RenderGate(every_n_passes=3)
    dm = EpisodeData(root, pinned=["ep0000"])
    pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
               max_epochs=2, num_sanity_val_steps=0, callbacks=[gate, ckpt]).fit(TinyModel(), datamodule=dm)
    assert gate.fit_passes == 2 and gate.render_passes == 0
    gate2, counters = RenderGate(every_n_passes=3), PassCounters()
    _trainer([gate2, counters], max_epochs=4, num_sanity_val_steps=0).fit(
        TinyModel(), datamodule=EpisodeData(root, pinned=["ep0000"]), ckpt_path=tmp_path / "last.ckpt")
    assert gate2.fit_passes == 4 and [o for o, _ in _opened(counters)] == [1, 0]  # passes 3 and 4


class _WorkersDuringTraining(pl.Callback):
    """Decode threads and processes alive at each training batch (a val pass cut short must not leave any)."""

    def __init__(self):
        import multiprocessing
        import threading

        self.seen = []  # only this fit's: another test in this worker process may have left its own behind
        self.before = set(threading.enumerate()), set(multiprocessing.active_children())

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        import multiprocessing
        import threading

        threads = [t.name for t in set(threading.enumerate()) - self.before[0]
                   if t.name.startswith("episodepipes-decode")]
        self.seen.append((len(threads), len(set(multiprocessing.active_children()) - self.before[1])))


@pytest.mark.parametrize("method", ["thread", "process"])
def test_passes_cut_short_release_their_workers(root, method):
    spy, gate = _WorkersDuringTraining(), RenderGate(every_n_passes=1, render_sanity_check=True)
    dm = EpisodeData(root, pinned=["ep0000", "ep0003"], method=method, num_workers=2)
    # the sanity check and limit_val_batches=1 both stop drawing batches long before the pipes end
    _trainer([gate, spy], max_epochs=3, num_sanity_val_steps=1, limit_val_batches=1).fit(TinyModel(), datamodule=dm)
    assert dm.loaders.videos["pinned"].stats["open_passes"] == 4  # the video pipe really ran, every pass
    assert len(spy.seen) > 4 and set(spy.seen) == {(0, 0)}
