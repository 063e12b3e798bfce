"""names="lerobot" and delta_timestamps=: a LeRobot policy's loop over the shards of a LeRobot-layout dataset."""

import json
import logging

import numpy as np
import pytest
import torch

from benchmarks.lerobot_data import make_lerobot
from episodepipes.pipes import EpisodeIndex, Source, metric_pipe, train_pipe, video_pipe
from episodepipes.sharding import WriteOptions, open_reader, write_shards

LENGTHS = (15, 12, 17, 9)
FPS = 10
VAL = ["episode_000001", "episode_000003"]
# what a Diffusion-Policy-like config asks for: 2 images and 2 states of history, an action chunk from t-1 to t+4
DELTA = {"observation.images.front": [-0.1, 0.0], "observation.state": [-0.1, 0.0],
         "action": [-0.1, 0.0, 0.1, 0.2, 0.3, 0.4]}
STEPS = dict(history={"observation_images_front": 2, "observation_state": 2, "action": 2}, horizon={"action": 5})
LEROBOT = {"observation_images_front": "observation.images.front",
           "observation_images_wrist": "observation.images.wrist",
           "observation_images_gripper": "observation.images.gripper", "observation_state": "observation.state",
           "next_reward": "next.reward", "next_done": "next.done"}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """A LeRobot v3.0 dataset (two episodes per mp4, an image feature) and its shards; the source episodes."""
    root = tmp_path_factory.mktemp("names")
    logging.getLogger("libav").setLevel(logging.ERROR)
    src = make_lerobot(root / "lr", lengths=LENGTHS, num_episodes=len(LENGTHS), fps=FPS, height=32, width=48)
    write_shards(open_reader(root / "lr", "lerobot"), root / "shards",
                 WriteOptions(format="lerobot", val_episodes=VAL, shard_size=60_000))
    return root / "shards", {f"episode_{s.index:06d}": s for s in src}


def _lerobot_key(key):
    """The LeRobot name of a batch key of the default names (pad masks too)."""
    if key.endswith("_pad"):
        return LEROBOT.get(key[:-4], key[:-4]) + "_is_pad"
    return LEROBOT.get(key, key)


def _query(t, n, offsets):
    """LeRobot's query rule for a window: steps clamped into the episode and which of them are padding."""
    raw = np.array([t + round(d * FPS) for d in offsets])
    return np.clip(raw, 0, n - 1), (raw < 0) | (raw >= n)


def policy_loss(batch):
    """A LeRobot-style policy step: it reads dotted keys and *_is_pad masks, as lerobot's policies do."""
    images = batch["observation.images.front"].float() / 255  # [B, 2, 3, H, W]
    state = batch["observation.state"]  # [B, 2, 7]
    target, pad = batch["action"], batch["action_is_pad"]  # [B, 6, 7], [B, 6]
    pred = state[:, -1:, :] + images.mean(dim=(1, 2, 3, 4))[:, None, None]
    err = ((pred - target) ** 2).mean(-1) * ~pad
    return err.sum() / (~pad).sum()


def test_a_lerobot_policy_loop_reads_its_own_names_and_seconds_windows_with_the_step_windows_values(dataset):
    shards, src = dataset
    pipe = train_pipe(shards, batch_size=4, seed=3, rank=0, world_size=1, num_workers=1, names="lerobot",
                      delta_timestamps=DELTA)
    steps = train_pipe(shards, batch_size=4, seed=3, rank=0, world_size=1, num_workers=1, **STEPS)
    assert len(pipe) == len(steps) == (LENGTHS[0] + LENGTHS[2]) // 4
    seen = 0
    for batch, want in zip(pipe, steps, strict=True):
        assert torch.isfinite(policy_loss(batch))
        # every value is the step windows' value of the same frame, under its LeRobot name
        assert sorted(batch) == sorted([*map(_lerobot_key, want), "task"])
        for key, value in want.items():
            got = batch[_lerobot_key(key)]
            assert got == value if isinstance(value, list) else torch.equal(got, value), key
        assert batch["task"] == batch["prompt"]
        for i, (eid, t) in enumerate(zip(batch["episode"], batch["frame"].tolist())):
            s, n = src[eid], LENGTHS[src[eid].index]
            for key in ("observation.state", "action"):  # LeRobot's own query rule, on the source's rows
                idx, pad = _query(t, n, DELTA[key])
                np.testing.assert_array_equal(batch[key][i].numpy(), s.arrays[key][idx], err_msg=f"{eid} {t} {key}")
                np.testing.assert_array_equal(batch[f"{key}_is_pad"][i].numpy(), pad)
            seen += 1
    assert seen == len(pipe) * 4


def _same_batches(a, b):
    a, b = list(a), list(b)
    assert len(a) == len(b) > 0
    for x, y in zip(a, b, strict=True):
        assert sorted(x) == sorted(y)
        for k in x:
            assert x[k] == y[k] if isinstance(x[k], list) else torch.equal(x[k], y[k]), k


def test_validation_windows_in_seconds_equal_the_step_windows(dataset):
    shards, _ = dataset
    common = dict(frames_per_episode=5, batch_size=3, rank=0, world_size=1, num_workers=1)
    _same_batches(metric_pipe(shards, delta_timestamps=DELTA, **common), metric_pipe(shards, **STEPS, **common))
    video = dict(episodes=VAL, batch_size=4, max_batches=10, num_workers=1)
    _same_batches(video_pipe(shards, delta_timestamps=DELTA, **video), video_pipe(shards, **STEPS, **video))
    named = list(video_pipe(shards, delta_timestamps=DELTA, names="lerobot", **video))
    plain = list(video_pipe(shards, **STEPS, **video))
    for x, y in zip(named, plain, strict=True):
        for k, v in y.items():
            got = x[_lerobot_key(k)]
            assert got == v if isinstance(v, list) else torch.equal(got, v), k


def test_names_lerobot_keeps_the_train_state_so_either_checkpoint_resumes(dataset):
    shards, _ = dataset
    kw = dict(batch_size=2, seed=1, rank=0, world_size=1, num_workers=1, horizon={"action": 3})
    plain, named = train_pipe(shards, **kw), train_pipe(shards, names="lerobot", **kw)
    it = iter(plain)
    next(it), next(it)
    state = plain.state_dict()
    rest = list(it)
    named.load_state_dict(state)
    resumed = list(named)
    assert [b["frame"].tolist() for b in resumed] == [b["frame"].tolist() for b in rest]
    assert all(torch.equal(a["action_is_pad"], b["action_pad"]) for a, b in zip(resumed, rest, strict=True))
    # the same state at the end (the loader's own yield count aside: the resumed loader counts from its load)
    assert named.state_dict()["root"] == plain.state_dict()["root"]


def test_a_window_may_name_its_key_by_its_lerobot_name_under_either_names(dataset):
    shards, _ = dataset
    pipe = metric_pipe(shards, frames_per_episode=2, batch_size=4, num_workers=1, history={"observation.state": 2})
    batch = next(iter(pipe))
    assert batch["observation_state"].shape == (4, 2, 7) and batch["observation_state_pad"].shape == (4, 2)
    with pytest.raises(ValueError, match="'observation_state' twice"):
        metric_pipe(shards, frames_per_episode=2, batch_size=4,
                    history={"observation.state": 2, "observation_state": 3})
    with pytest.raises(ValueError, match="window key 'observation_state' is in delta_timestamps and in history"):
        metric_pipe(shards, frames_per_episode=2, batch_size=4, horizon={"observation_state": 2},
                    delta_timestamps={"observation.state": [0.0, 0.1]})


def test_seconds_off_the_frame_grid_and_bad_options_are_refused_by_name(dataset):
    shards, _ = dataset
    kw = dict(frames_per_episode=2, batch_size=4)
    with pytest.raises(ValueError, match=r"delta_timestamps\['action'\]: offset 0.105 s .* tolerance_s"):
        metric_pipe(shards, delta_timestamps={"action": [0.0, 0.105]}, **kw)
    assert len(metric_pipe(shards, delta_timestamps={"action": [0.0, 0.105]}, tolerance_s=0.01, **kw)) == 1
    with pytest.raises(ValueError, match=r"gives steps \[-10, -5, 0\]; a window is consecutive"):
        train_pipe(shards, batch_size=2, seed=0, delta_timestamps={"action": [-1.0, -0.5, 0.0]})
    with pytest.raises(ValueError, match="in delta_timestamps and in history"):
        metric_pipe(shards, delta_timestamps={"action": [0.0]}, history={"action": 2}, **kw)
    with pytest.raises(ValueError, match="names='nope' should be one of"):
        video_pipe(shards, episodes=VAL, batch_size=2, max_batches=1, names="nope")
    with pytest.raises(ValueError, match="tolerance_s=0 should be"):
        train_pipe(shards, batch_size=2, seed=0, tolerance_s=0)
    with pytest.raises(ValueError, match="window key 'observation.nope' is not a camera or array"):
        metric_pipe(shards, delta_timestamps={"observation.nope": [0.0]}, **kw)
    with pytest.raises(ValueError, match="a mixture's sources may differ"):
        train_pipe({"a": Source(shards, 1.0)}, batch_size=2, seed=0, names="lerobot")


def _hostile(shards, tmp_path, edit):
    """A copy of ``shards`` whose index.json ``edit`` changed (the shards and columns are links to the original)."""
    out = tmp_path / "hostile"
    out.mkdir()
    for f in shards.iterdir():
        (out / f.name).symlink_to(f) if f.name != "index.json" else None
    meta = json.loads((shards / "index.json").read_text())
    edit(meta["schemas"][0])
    (out / "index.json").write_text(json.dumps(meta))
    return out


@pytest.mark.parametrize(("edit", "why"), [
    (lambda s: s["arrays"]["action"].update(source="valid"), "would be named 'valid', which is a key the pipe sets"),
    (lambda s: s["arrays"]["action"].update(source="observation.state"), "have one source name 'observation.state'"),
    (lambda s: s["arrays"]["next_done"].update(source="action_is_pad"), "would be named 'action_is_pad', which is"),
    (lambda s: s["arrays"]["action"].update(source="act ion"), "source name 'act ion', not 1-128 characters"),
    (lambda s: s["arrays"]["action"].update(source="../x"), r"source name '\.\./x', not 1-128"),
    (lambda s: s["cameras"]["observation_images_front"].update(source="a" * 129), "not 1-128 characters"),
    (lambda s: s["arrays"]["action"].update(source="task"), "would be named 'task'"),
])
def test_hostile_source_names_are_refused_by_name_only_when_asked_for(dataset, tmp_path, edit, why):
    shards, _ = dataset
    bad = _hostile(shards, tmp_path, edit)
    kw = dict(frames_per_episode=2, batch_size=4, num_workers=1, horizon={"action": 2})
    with pytest.raises(ValueError, match=why) as e:
        metric_pipe(bad, names="lerobot", **kw)
    assert str(bad) in str(e.value) and "names='index'" in str(e.value)
    assert next(iter(metric_pipe(bad, **kw)))["action"].shape == (4, 2, 7)  # the default names do not read them


def test_names_lerobot_on_a_dataset_whose_names_are_its_own_renames_only_the_masks(shard_folder):
    shards = shard_folder("plain_names", num_episodes=3, length=6, height=16, width=24)
    assert all(a.source == a.name for a in EpisodeIndex.open(shards).episodes[0].arrays.values())
    batch = next(iter(metric_pipe(shards, split="train", frames_per_episode=2, batch_size=2, names="lerobot",
                                  history={"state": 2})))
    assert {"state", "state_is_pad", "front", "task"} <= set(batch) and "state_pad" not in batch


def test_the_readme_example_runs_on_a_lerobot_dataset_s_shards(dataset, tmp_path, monkeypatch):
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    (code,) = [b for b in re.findall(r"```python\n(.*?)```", readme, flags=re.S) if 'names="lerobot"' in b]
    shards, _ = dataset
    monkeypatch.chdir(tmp_path)
    (tmp_path / "lerobot_shards").symlink_to(shards)
    scope = {}
    exec(compile(code, "README.md:lerobot", "exec"), scope)
    batch = scope["batch"]
    assert batch["observation.images.front"].shape == (8, 2, 3, 32, 48)
    assert batch["action"].shape == (8, 16, 7) and batch["action_is_pad"].shape == (8, 16)
    assert batch["task"] == batch["prompt"] and len(scope["val"]) == 1


def test_the_current_step_alone_keeps_a_step_axis_as_lerobot_gives_it(dataset):
    shards, _ = dataset
    batch = next(iter(metric_pipe(shards, frames_per_episode=2, batch_size=4, num_workers=1, names="lerobot",
                                  delta_timestamps={"action": [0.0], "observation.images.wrist": [0.0]})))
    assert batch["action"].shape == (4, 1, 7) and batch["action_is_pad"].shape == (4, 1)
    assert batch["observation.images.wrist"].shape == (4, 1, 3, 32, 48) and not batch["action_is_pad"].any()


def test_a_closed_gate_of_a_renamed_video_pipe_still_reads_nothing(dataset):
    shards, _ = dataset
    pipe = video_pipe(shards, episodes=VAL, batch_size=4, max_batches=2, gate=lambda: False, names="lerobot",
                      delta_timestamps={"action": [0.0, 0.1]})
    assert list(pipe) == [] and len(pipe) == 2
    assert pipe.stats["bytes_read"] == pipe.stats["frames_decoded"] == pipe.stats["workers_started"] == 0
    assert pipe.stats["closed_passes"] == 1


def test_a_run_short_of_the_current_step_gives_those_steps_of_the_run_from_it(dataset):
    shards, _ = dataset
    kw = dict(batch_size=4, seed=2, rank=0, world_size=1, num_workers=1)
    delta = {"action": [0.2, 0.3], "observation.state": [-0.2, -0.1], "observation.images.wrist": [0.1]}
    short = train_pipe(shards, names="lerobot", delta_timestamps=delta, **kw)
    full = train_pipe(shards, horizon={"action": 4, "observation_images_wrist": 2}, history={"observation_state": 3},
                      **kw)
    for a, b in zip(short, full, strict=True):
        for name, key, cut in (("action", "action", slice(2, 4)), ("observation.state", "observation_state",
                               slice(0, 2)), ("observation.images.wrist", "observation_images_wrist", slice(1, 2))):
            assert torch.equal(a[name], b[key][:, cut]) and a[name].is_contiguous(), name
            assert torch.equal(a[f"{name}_is_pad"], b[f"{key}_pad"][:, cut])
    assert short.state_dict()["root"] == full.state_dict()["root"]
