import copy
import itertools

import numpy as np
import pytest
import torch
from helpers import make_shards

from episodepipes.pipes import EpisodeIndex, video_pipe
from episodepipes.pipes.train import train_pipe
from episodepipes.sharding.formats.synthetic import SyntheticReader

SHAPE = dict(num_episodes=6, lengths=(12, 7, 5, 9, 11, 4), height=16, width=24)  # train: ep0,1,3,4 = 39 frames
TRAIN = {"ep0000": 12, "ep0001": 7, "ep0003": 9, "ep0004": 11}
WINDOWS = dict(history={"state": 3, "front": 2}, horizon={"action": 4})


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    out = make_shards(tmp_path_factory.mktemp("train") / "s", shard_size=20_000, **SHAPE)
    return EpisodeIndex.open(out)


def _keys(batch):
    """A comparable view of a batch: ids plus checksums of every tensor, per sample."""
    sums = [v.reshape(len(v), -1).double().sum(1).tolist() for _, v in sorted(batch.items()) if torch.is_tensor(v)]
    return list(zip(batch["episode"], *sums))


def _items(pipe):
    return [(e, f) for b in pipe for e, f in zip(b["episode"], b["frame"].tolist())]


def test_same_seed_same_order_other_seed_other_order(index):
    a = _items(train_pipe(index, batch_size=4, seed=7, rank=0, world_size=1))
    assert a == _items(train_pipe(index, batch_size=4, seed=7, rank=0, world_size=1))
    assert a != _items(train_pipe(index, batch_size=4, seed=8, rank=0, world_size=1))


def test_every_epoch_covers_every_frame_once_in_a_new_order(index):
    pipe = train_pipe(index, batch_size=1, seed=0, rank=0, world_size=1, epochs=1)
    every = sorted((e, f) for e, n in TRAIN.items() for f in range(n))
    first, second = _items(pipe), _items(pipe)  # each iter() is the next epoch
    assert sorted(first) == sorted(second) == every
    assert first != second
    assert _items(train_pipe(index, batch_size=1, seed=0, rank=0, world_size=1, epochs=2)) == first + second


@pytest.mark.parametrize("world, batch", [(1, 4), (2, 3), (3, 5), (4, 2)])
def test_ranks_get_equal_batches_len_matches_and_ranks_are_disjoint(index, world, batch):
    seen = []
    for rank in range(world):
        pipe = train_pipe(index, batch_size=batch, seed=1, rank=rank, world_size=world, num_workers=1)
        batches = list(pipe)
        assert len(batches) == len(pipe) == 39 // (world * batch)
        assert all(len(b["episode"]) == batch for b in batches)
        seen += [(e, f) for b in batches for e, f in zip(b["episode"], b["frame"].tolist())]
    assert len(set(seen)) == len(seen) > 39 - world * batch


def test_windows_hold_source_values_pad_masks_and_decoded_frames(index):
    reader = SyntheticReader(**SHAPE)
    decoded = {e: next(iter(video_pipe(index, episodes=[e], batch_size=16, max_batches=1))) for e in TRAIN}
    pipe = train_pipe(index, batch_size=5, seed=3, rank=0, world_size=1, **WINDOWS)
    n = 0
    for b in pipe:
        assert b["state"].shape[1:] == (3, 7) and b["front"].shape[1:] == (2, 3, 16, 24)
        assert b["action"].shape[1:] == (4, 7) and b["wrist"].shape[1:] == (3, 16, 24)
        for i, (e, t) in enumerate(zip(b["episode"], b["frame"].tolist())):
            arrays, length = reader.read(e).arrays, TRAIN[e]
            for key, offsets in (("state", range(-2, 1)), ("front", range(-1, 1)), ("action", range(0, 4))):
                raw = np.array([t + d for d in offsets])
                steps = raw.clip(0, length - 1)
                assert b[f"{key}_pad"][i].tolist() == (raw != steps).tolist()
                want = decoded[e]["front"][steps] if key == "front" else torch.from_numpy(arrays[key][steps])
                assert torch.equal(b[key][i], want), (key, e, t)
            assert torch.equal(b["wrist"][i], decoded[e]["wrist"][t])  # no window: the current frame only
            assert torch.equal(b["keypoints"][i], torch.from_numpy(arrays["keypoints"][t]))
            n += 1
    assert n == 35


def test_array_windows_read_only_their_npy_members(tmp_path):
    idx = EpisodeIndex.open(make_shards(tmp_path / "s", num_episodes=2, length=8, height=96, width=128))
    plain = train_pipe(idx, batch_size=2, seed=0, rank=0, world_size=1)
    windowed = train_pipe(idx, batch_size=2, seed=0, rank=0, world_size=1, history={"state": 4},
                          horizon={"action": 4})
    list(plain), list(windowed)
    extra_steps = windowed.stats["frames_read"] - plain.stats["frames_read"]
    frame_bytes = plain.stats["bytes_read"] / plain.stats["frames_read"]
    assert extra_steps > 0
    ratio = (windowed.stats["bytes_read"] - plain.stats["bytes_read"]) / (extra_steps * frame_bytes)
    assert ratio < 0.3, ratio  # headers and npy data; the JPEGs beside them are skipped


def test_camera_history_decodes_each_distinct_frame_of_a_batch_once(index, monkeypatch):
    from episodepipes.pipes.frames import JpegFrames

    calls = {"front": 0, "wrist": 0}
    real = JpegFrames.decode

    def counting(self, camera, *a, **kw):
        calls[camera] += 1
        return real(self, camera, *a, **kw)

    monkeypatch.setattr(JpegFrames, "decode", counting)
    batches = list(train_pipe(index, batch_size=13, seed=0, rank=0, world_size=1, history={"front": 3}))
    frames = [(e, t) for b in batches for e, t in zip(b["episode"], b["frame"].tolist())]
    assert len(frames) == 39
    # a frame that several samples of one batch show (overlapping windows, a step both current and history)
    # is decoded once per batch
    per_batch = [list(zip(b["episode"], b["frame"].tolist())) for b in batches]
    assert calls["wrist"] == sum(len(set(fs)) for fs in per_batch)
    front = sum(len({(e, max(t + d, 0)) for e, t in fs for d in (-2, -1, 0)}) for fs in per_batch)
    assert calls["front"] == front < sum(len({max(t + d, 0) for d in (-2, -1, 0)}) for e, t in frames)


def plus_frame(sample):
    """A module-level transform, so it pickles into process workers."""
    return {**sample, "state": sample["state"] * 0 + sample["frame"], "extra": np.float32(sample["frame"])}


@pytest.mark.parametrize("method", ["thread", "process"])
def test_transform_runs_per_sample_before_collation(index, method):
    pipe = train_pipe(index, batch_size=4, seed=0, rank=0, world_size=1, method=method, transform=plus_frame,
                      history={"state": 2})
    for b in pipe:
        assert torch.equal(b["extra"], b["frame"].float())
        assert torch.equal(b["state"], b["frame"].float()[:, None, None].expand_as(b["state"]))


def test_unpicklable_transform_is_refused_for_processes(index):
    with pytest.raises(TypeError, match="does not pickle"):
        train_pipe(index, batch_size=4, seed=0, method="process", transform=lambda s: s)


def test_infinite_mode_has_no_len_and_continues_epoch_after_epoch(index):
    pipe = train_pipe(index, batch_size=4, seed=2, rank=1, world_size=2, epochs=None)
    with pytest.raises(TypeError, match="epochs=None"):
        len(pipe)
    two = train_pipe(index, batch_size=4, seed=2, rank=1, world_size=2, epochs=2)
    assert [_keys(b) for b in itertools.islice(pipe, len(two))] == [_keys(b) for b in two]


def test_bad_options_name_the_fix(index):
    with pytest.raises(ValueError, match="lower batch_size"):
        train_pipe(index, batch_size=40, seed=0, rank=0, world_size=1)
    with pytest.raises(ValueError, match="seed"):
        train_pipe(index, batch_size=4, seed=-1)
    with pytest.raises(ValueError, match="epochs=0"):
        train_pipe(index, batch_size=4, seed=0, epochs=0)
    with pytest.raises(ValueError, match="splits there"):
        train_pipe(index, split="test", batch_size=4, seed=0)


def check_save_load(make, midpoints, passes):
    """Like torchdata's run_test_save_load_state: save at each midpoint, restore into a fresh pipe, compare."""
    ref = make()
    flat = [_keys(b) for _ in range(passes) for b in ref]
    for m in midpoints:
        pipe, head = make(), []
        while len(head) < m:
            it = iter(pipe)
            head += [_keys(b) for b in itertools.islice(it, m - len(head))]
        state = copy.deepcopy(pipe.state_dict())
        pipe.close()
        fresh, tail = make(), []
        fresh.load_state_dict(state)
        while len(tail) < len(flat) - m:
            got = [_keys(b) for b in fresh]
            assert got, f"an empty pass after resuming at batch {m}"
            tail += got
        assert head + tail == flat, m


@pytest.mark.parametrize("method", ["thread", "process"])
def test_resume_at_any_step_gives_the_uninterrupted_batches(index, method):
    def make():
        return train_pipe(index, batch_size=3, seed=5, rank=1, world_size=2, method=method, epochs=1, **WINDOWS)

    per = len(make())  # 6 batches per pass; three passes = three epochs
    check_save_load(make, [0, 1, per - 1, per, per + 2, 2 * per + 5], passes=3)


def test_resume_within_a_multi_epoch_and_an_endless_pass(index):
    check_save_load(lambda: train_pipe(index, batch_size=4, seed=9, rank=0, world_size=1, epochs=2), [3, 9, 10],
                    passes=1)

    def endless():
        return train_pipe(index, batch_size=4, seed=9, rank=0, world_size=1, epochs=None)

    want = [_keys(b) for b in itertools.islice(endless(), 25)]
    pipe = endless()
    head = [_keys(b) for b in itertools.islice(iter(pipe), 13)]
    fresh = endless()
    fresh.load_state_dict(pipe.state_dict())
    assert head + [_keys(b) for b in itertools.islice(iter(fresh), 12)] == want


def test_state_is_a_small_cursor_and_the_settings_it_depends_on(index):
    pipe = train_pipe(index, batch_size=4, seed=5, rank=0, world_size=1, history={"state": 3})
    next(iter(pipe))
    cursor = dict(pipe.state_dict()["root"]["source"]["source"])
    assert len(cursor.pop("plan")) == 16  # a fingerprint of the episode ids and lengths
    assert cursor == {"seed": 5, "epoch": 0, "pos": 4, "stop": 1, "start": 0, "consumed": 4, "world_size": 1, "rank": 0,
                      "batch_size": 4, "global_batch": 4, "frames": 39, "windows": {"state": [-2, 0]}}


@pytest.mark.parametrize("stop", [4, 9, 14])  # mid-epoch, end of epoch 0 (9 batches each), mid-epoch 1
def test_lightning_checkpoint_resumes_the_same_batches(index, tmp_path, stop):
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    class Model(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.lin, self.seen = torch.nn.Linear(7, 1), []

        def training_step(self, batch, i):
            self.seen.append(list(zip(batch["episode"], batch["frame"].tolist())))
            return self.lin(batch["state"]).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

        def train_dataloader(self):
            return train_pipe(index, batch_size=4, seed=1, rank=0, world_size=1, num_workers=1)

    def fit(model, callbacks=(), ckpt=None, **kw):
        L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                  enable_checkpointing=bool(callbacks), callbacks=list(callbacks), **kw).fit(model, ckpt_path=ckpt)

    full = Model()
    fit(full, max_epochs=2)
    first = Model()
    fit(first, [ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=stop, save_top_k=-1)], max_steps=stop)
    (ckpt,) = tmp_path.glob("*.ckpt")
    cursor = torch.load(ckpt, weights_only=False)["loops"]["fit_loop"]["state_dict"]["combined_loader"]
    assert cursor[0]["root"]["source"]["source"]["seed"] == 1
    rest = Model()
    fit(rest, ckpt=ckpt, max_epochs=2)
    pipe = full.train_dataloader()
    assert full.seen == [list(zip(b["episode"], b["frame"].tolist())) for _ in range(2) for b in pipe]  # epochs 0, 1
    assert len(full.seen) == 18 and first.seen + rest.seen == full.seen


_TORCH_IN_WORKER = """
import sys, torch
from episodepipes.pipes.train import train_pipe

def big_torch_op(sample):
    # over torch's parallel grain (32768 elements): runs on the intra-op (OpenMP) pool
    sample["norm"] = float((torch.ones(256, 256) * 2).sum())
    return sample

if __name__ == "__main__":  # process workers import the main module, as multiprocessing's spawned children do
    x = torch.randn(512, 512)
    (x @ x).sum(), (x + 1).sum()  # the parent has used its OpenMP pool, as any training process has
    pipe = train_pipe(sys.argv[1], batch_size=4, seed=0, rank=0, world_size=1, method="process",
                      transform=big_torch_op)
    assert [float(b["norm"][0]) for b in pipe] == [2 * 256 * 256] * len(pipe)
    print("ok")
"""


def test_torch_ops_in_forked_process_workers_do_not_hang(index, tmp_path):
    """A forked child cannot use the parent's OpenMP threads: without one intra-op thread it waits forever."""
    import subprocess
    import sys

    script = tmp_path / "torch_in_worker.py"
    script.write_text(_TORCH_IN_WORKER)
    proc = subprocess.run([sys.executable, str(script), str(index.root)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


@pytest.mark.parametrize("method", ["thread", "process"])
def test_frames_decoded_counts_every_jpeg_of_camera_windows(index, method):
    pipe = train_pipe(index, batch_size=13, seed=0, rank=0, world_size=1, history={"front": 3}, method=method)
    per_batch = [list(zip(b["episode"], b["frame"].tolist())) for b in pipe]
    frames = [f for fs in per_batch for f in fs]
    # distinct front steps of each batch, plus each batch's distinct current wrist frames
    front = sum(len({(e, max(t + d, 0)) for e, t in fs for d in (-2, -1, 0)}) for fs in per_batch)
    assert pipe.stats["frames_decoded"] == front + sum(len(set(fs)) for fs in per_batch)
    assert pipe.stats["frames_decoded"] > 2 * len(frames)  # more than cameras per sample: windows count


def _shift_in_place(sample):
    sample["state"] += 1.0  # a window key
    sample["action"] *= 2.0  # a plain array key
    return sample


def test_transform_may_change_arrays_in_place(index):
    kw = dict(batch_size=4, seed=0, history={"state": 3}, num_workers=1)
    plain = next(iter(train_pipe(index, **kw)))
    shifted = next(iter(train_pipe(index, transform=_shift_in_place, **kw)))
    assert torch.equal(shifted["state"], plain["state"] + 1.0)
    assert torch.equal(shifted["action"], plain["action"] * 2.0)


def _shards_with_state_dtypes(out, dtypes):
    """Shard synthetic episodes whose ``state`` array is stored as ``dtypes[i]`` in episode i."""
    import dataclasses

    from episodepipes.sharding.write.encode import EncodeOptions, encode_episode
    from episodepipes.sharding.write.writer import ShardWriter

    reader = SyntheticReader(num_episodes=len(dtypes), length=6, height=16, width=24)
    with ShardWriter(out, shard_size=1 << 20, options={"jpeg_quality": 90}) as w:
        for eid, dt in zip(reader.episode_ids(), dtypes):
            ep = reader.read(eid)
            ep = dataclasses.replace(ep, split="train", arrays={**ep.arrays, "state": ep.arrays["state"].astype(dt)})
            w.add(encode_episode(ep, EncodeOptions()))
    return EpisodeIndex.open(out)


def test_episodes_of_another_array_dtype_are_refused_by_name(tmp_path):
    idx = _shards_with_state_dtypes(tmp_path / "s", ["float32", "float64"])
    msg = r"'ep0000' and 'ep0001'.*'state' is <f4 \[7\] in episode 'ep0000' but <f8 \[7\] in 'ep0001'"
    with pytest.raises(ValueError, match=msg):
        train_pipe(idx, batch_size=4, seed=0, rank=0, world_size=1, history={"state": 2})
    with pytest.raises(ValueError, match=msg):  # the other builders check the same way
        video_pipe(idx, episodes=["ep0000", "ep0001"], batch_size=4, max_batches=1)


def test_episodes_of_one_dtype_give_their_exact_values(tmp_path):
    idx = _shards_with_state_dtypes(tmp_path / "s", ["float64", "float64"])
    reader = SyntheticReader(num_episodes=2, length=6, height=16, width=24)
    for b in train_pipe(idx, batch_size=4, seed=0, rank=0, world_size=1, history={"state": 2}):
        assert b["state"].dtype == torch.float64
        for i, (e, t) in enumerate(zip(b["episode"], b["frame"].tolist())):
            want = reader.read(e).arrays["state"].astype("float64")[[max(t - 1, 0), t]]
            assert torch.equal(b["state"][i], torch.from_numpy(want))


def _scramble_reserved(sample):
    return {**sample, "timestamp": -1.0, "frame": -1, "episode": "x", "valid": False, "prompt": "x"}


def test_reserved_keys_are_restored_after_the_transform(index):
    kw = dict(batch_size=4, seed=0, num_workers=1, history={"state": 2})
    plain = next(iter(train_pipe(index, **kw)))
    scrambled = next(iter(train_pipe(index, transform=_scramble_reserved, **kw)))
    for key in ("timestamp", "frame", "episode", "valid", "prompt"):
        got, want = scrambled[key], plain[key]
        assert torch.equal(got, want) if torch.is_tensor(want) else got == want, key
