"""history=/horizon= on metric_pipe and video_pipe: the train pipe's windows, for the frames validation plans."""

import numpy as np
import pytest

from episodepipes.pipes import EpisodeIndex, metric_pipe, train_pipe, video_pipe

WINDOWS = dict(history={"front": 2, "state": 3}, horizon={"action": 4, "state": 2})
KEYS = ("front", "front_pad", "wrist", "state", "state_pad", "action", "action_pad", "keypoints", "timestamp")
VAL = ["ep0002", "ep0005"]  # SyntheticReader puts every third episode in "val"


@pytest.fixture(scope="module")
def shards(shard_folder):
    return shard_folder("windows", num_episodes=6, length=9, height=24, width=32, shard_size=30_000)


def _rows(batches):
    """(episode, frame) -> that sample's values of `KEYS` as numpy arrays, and ``valid``."""
    out = {}
    for b in batches:
        for i, (e, t) in enumerate(zip(b["episode"], b["frame"].tolist())):
            row = {k: np.asarray(b[k][i]) for k in KEYS if k in b}
            row["valid"] = bool(b["valid"][i])
            out.setdefault((e, t), []).append(row)
    return out


def _train_rows(shards):
    """Every val frame's training sample (batch 1: drop-last drops nothing)."""
    pipe = train_pipe(shards, split="val", batch_size=1, seed=0, rank=0, world_size=1, num_workers=1, **WINDOWS)
    got = _rows(pipe)
    assert all(len(v) == 1 for v in got.values())
    return {k: v[0] for k, v in got.items()}


def _same(a, b, where):
    for k in KEYS:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, (where, k)
        np.testing.assert_array_equal(a[k], b[k], err_msg=f"{where} {k}")


def test_validation_windows_are_the_train_pipes_for_the_same_frames(shards):
    want = _train_rows(shards)
    assert len(want) == 2 * 9
    video = _rows(video_pipe(shards, episodes=VAL, batch_size=4, max_batches=100, **WINDOWS))
    assert sorted(video) == sorted(want)
    metric = _rows(metric_pipe(shards, frames_per_episode=4, batch_size=3, rank=0, world_size=1, **WINDOWS))
    assert len(metric) == 8
    for got in (video, metric):
        for key, rows in got.items():
            for row in rows:
                _same(row, want[key], key)
                assert row["valid"]
    # the masks are the convention's: history pads at the start, horizon past the end
    assert want["ep0002", 0]["front_pad"].tolist() == [True, False]
    assert want["ep0002", 0]["state_pad"].tolist() == [True, True, False, False]
    assert want["ep0002", 8]["action_pad"].tolist() == [False, True, True, True]
    assert want["ep0002", 8]["state_pad"].tolist() == [False, False, False, True]


@pytest.mark.parametrize("method", ["thread", "process"])
def test_a_two_step_image_history_shows_two_different_frames_and_pads_at_the_start(shards, method):
    batches = list(video_pipe(shards, episodes=["ep0002"], batch_size=5, max_batches=10, history={"front": 2},
                              method=method))
    rows = _rows(batches)
    for t in range(9):
        (row,) = rows["ep0002", t]
        prev, cur = row["front"]
        assert row["front"].shape == (2, 3, 24, 32)
        if t == 0:  # before the episode: the first frame again, marked
            assert row["front_pad"].tolist() == [True, False] and np.array_equal(prev, cur)
        else:
            assert row["front_pad"].tolist() == [False, False] and not np.array_equal(prev, cur)
            np.testing.assert_array_equal(prev, rows["ep0002", t - 1][0]["front"][1])  # its own frame t-1


def test_a_horizon_of_actions_gives_the_next_steps_for_an_error_over_them(shards):
    idx = EpisodeIndex.open(shards)
    plain = _rows(video_pipe(idx, episodes=["ep0005"], batch_size=9, max_batches=1))
    got = _rows(video_pipe(idx, episodes=["ep0005"], batch_size=9, max_batches=1, horizon={"action": 3}))
    for t in range(9):
        (row,) = got["ep0005", t]
        steps = [min(t + d, 8) for d in range(3)]
        np.testing.assert_array_equal(row["action"], np.stack([plain["ep0005", s][0]["action"] for s in steps]))
        assert row["action_pad"].tolist() == [t + d > 8 for d in range(3)]


def test_each_frame_a_batch_shows_is_read_once_and_decoded_once(shards):
    pipe = video_pipe(shards, episodes=["ep0002"], batch_size=4, max_batches=10, history={"front": 3})
    plain = video_pipe(shards, episodes=["ep0002"], batch_size=4, max_batches=10)
    batches, _ = list(pipe), list(plain)
    assert [len(b["frame"]) for b in batches] == [4, 4, 1] and len(pipe) == 3
    # batch k shows front frames from max(4k - 2, 0) to its last frame, each decoded once; wrist: its own frames
    distinct_front = (4) + (4 + 2) + (1 + 2)
    assert pipe.stats["frames_decoded"] == distinct_front + 9
    assert pipe.stats["frames_read"] == plain.stats["frames_read"] == 9  # window steps are read with the pass


@pytest.mark.parametrize("world", [2, 4])
def test_metric_pipe_with_windows_stays_even_over_ranks(shards, world):
    idx = EpisodeIndex.open(shards)
    ranks = [metric_pipe(idx, frames_per_episode=3, batch_size=2, rank=r, world_size=world, **WINDOWS)
             for r in range(world)]
    want = _train_rows(idx)
    got = [list(p) for p in ranks]
    assert len({len(p) for p in ranks}) == 1
    assert [len(b) for b in got] == [len(ranks[0])] * world
    sizes = [sum(len(b["frame"]) for b in bs) for bs in got]
    assert len(set(sizes)) == 1  # 6 frames over 4 ranks: 2 each, padded with valid=False repeats
    valid = []
    for bs in got:
        for key, rows in _rows(bs).items():
            for row in rows:
                _same(row, want[key], key)
                if row["valid"]:
                    valid.append(key)
    assert sorted(valid) == sorted((e, t) for e in VAL for t in (1, 4, 7))


def test_a_closed_gate_with_windows_reads_and_decodes_nothing(shards):
    pipe = video_pipe(shards, episodes=VAL, batch_size=4, max_batches=3, gate=lambda: False, **WINDOWS)
    assert len(pipe) == 3
    it = iter(pipe)
    del it
    assert list(pipe) == [] and list(pipe) == []
    s = pipe.stats
    assert s["bytes_read"] == s["frames_read"] == s["frames_decoded"] == s["workers_started"] == 0


def test_bad_windows_are_refused_by_name(shards):
    with pytest.raises(ValueError, match="'nope' is not a camera or array"):
        video_pipe(shards, episodes=VAL, batch_size=4, max_batches=3, history={"nope": 2})
    with pytest.raises(ValueError, match=r"horizon\['action'\]=0"):
        metric_pipe(shards, frames_per_episode=2, batch_size=2, rank=0, world_size=1, horizon={"action": 0})


def test_the_overlay_draws_a_ground_truth_window_as_a_line_through_its_real_steps():
    import torch

    from episodepipes.lightning_glue.overlay import GROUND_TRUTH, draw_overlay

    frames = np.zeros((1, 100, 100, 3), np.uint8)
    batch = {"episode": ["ep0002"], "frame": torch.tensor([7]),
             "keypoints": torch.tensor([[[10.0, 40.0], [60.0, 40.0], [60.0, 80.0]]]),
             "keypoints_pad": torch.tensor([[False, False, True]])}
    draw_overlay(frames, batch, None, gt_key="keypoints")
    r, g, b = frames[0, 40, 35].tolist()  # between the two steps inside the episode (antialiased: near the colour)
    assert g > 150 and g > 2 * max(r, b) and GROUND_TRUTH[1] > 2 * max(GROUND_TRUTH[0], GROUND_TRUTH[2])
    assert not frames[0, 60, 60].any()  # the padded step is not drawn


@pytest.fixture(scope="module")
def h264(tmp_path_factory):
    from helpers import write_raw

    from episodepipes.sharding.cli import main
    from episodepipes.sharding.formats.synthetic import SyntheticReader

    d = tmp_path_factory.mktemp("windows_h264")
    src = write_raw(d / "src", SyntheticReader(num_episodes=6, length=9, height=24, width=32))
    assert main(["write", str(src), str(d / "out"), "--workers", "1", "--shard-size", "30kB", "--codec", "h264",
                 "--gop", "3"]) == 0
    return d / "out"


@pytest.mark.parametrize("method", ["thread", "process"])
def test_camera_windows_on_video_shards_are_the_train_pipes(h264, method):
    want = _train_rows(h264)
    video = _rows(video_pipe(h264, episodes=VAL, batch_size=4, max_batches=100, method=method, **WINDOWS))
    metric = _rows(metric_pipe(h264, frames_per_episode=4, batch_size=3, rank=0, world_size=1, method=method,
                               **WINDOWS))
    assert sorted(video) == sorted(want) and len(metric) == 8
    for got in (video, metric):
        for key, rows in got.items():
            for row in rows:
                _same(row, want[key], key)
                assert row["valid"]
    for t in range(1, 9):
        assert not np.array_equal(*want["ep0002", t]["front"])


def test_the_overlay_writer_renders_a_video_pipe_with_an_image_history_and_a_keypoint_horizon(shards, tmp_path):
    import lightning.pytorch as pl

    from episodepipes.lightning_glue import OverlayVideoWriter, ValLoaders
    from episodepipes.lightning_glue.video_writer import read_rgb

    class Model(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.seen = []

        def validation_step(self, batch, batch_idx, dataloader_idx=0):
            self.seen.append((tuple(batch["front"].shape), batch["keypoints_pad"].tolist()))
            return {}

    class Data(pl.LightningDataModule):
        def val_dataloader(self):
            return ValLoaders(videos={"pinned": video_pipe(shards, episodes=["ep0002"], batch_size=5, max_batches=2,
                                                           history={"front": 2}, horizon={"keypoints": 3})})

    writer = OverlayVideoWriter(tmp_path, cameras=["front"], gt_key="keypoints", every_n_passes=1, log_to=None)
    model = Model()
    pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
               enable_model_summary=False, callbacks=[writer]).validate(model, datamodule=Data(), verbose=False)
    assert [s for s, _ in model.seen] == [(5, 2, 3, 24, 32), (4, 2, 3, 24, 32)]
    assert model.seen[1][1][-1] == [False, True, True]  # frame 8: two steps past the episode's end
    (path,) = writer.written
    assert read_rgb(path).shape == (9, 24, 32, 3)


@pytest.mark.parametrize("method", ["thread", "process"])
def test_a_damaged_frame_makes_every_sample_whose_window_shows_it_corrupt(shards, tmp_path, method):
    import shutil
    import tarfile

    root = shutil.copytree(shards, tmp_path / "s")
    name = "ep0002/000004.front.jpg"
    for tar_path in sorted(root.glob("*.tar")):
        with tarfile.open(tar_path) as tar:
            found = [m for m in tar if m.name == name]
        if found:
            break
    (m,) = found
    with open(tar_path, "r+b") as f:  # one byte of the JPEG flipped: the index's crc32 no longer matches
        f.seek(m.offset_data + m.size // 2)
        b = f.read(1)
        f.seek(m.offset_data + m.size // 2)
        f.write(bytes([b[0] ^ 0xFF]))
    pipe = video_pipe(root, episodes=["ep0002"], batch_size=4, max_batches=10, history={"front": 2}, method=method)
    valid = [v for b in pipe for v in b["valid"].tolist()]
    assert valid == [True] * 4 + [False] * 2 + [True] * 3  # frames 4 and 5 show step 4


def test_windows_over_an_http_root_are_the_local_ones(shards, tmp_path):
    import shutil

    from httpserver import RangeServer

    shutil.copytree(shards, tmp_path / "www" / "v1")
    server = RangeServer(tmp_path / "www")
    try:
        url = f"{server.endpoint}/v1/"
        for build in (lambda r: video_pipe(r, episodes=VAL, batch_size=4, max_batches=100, **WINDOWS),
                      lambda r: metric_pipe(r, frames_per_episode=4, batch_size=3, rank=0, world_size=1, **WINDOWS)):
            local, remote = _rows(build(shards)), _rows(build(url))
            assert sorted(local) == sorted(remote)
            for key, rows in remote.items():
                for got, want in zip(rows, local[key], strict=True):
                    _same(got, want, key)
    finally:
        server.close()
