import io
import json
import pickle
import tarfile

import av
import cv2
import numpy as np
import pyarrow.parquet as pq
import pytest

from benchmarks.lerobot_data import IMAGE_KEY, VIDEO_KEYS, available_encoders, make_lerobot
from episodepipes.format import npy_load
from episodepipes.pipes import EpisodeIndex
from episodepipes.sharding import cli
from episodepipes.sharding.episode import EpisodeError, EpisodeReader
from episodepipes.sharding.formats.lerobot import LeRobotReader, _closest, _match
from episodepipes.sharding.write.encode import EncodeOptions, encode_episode
from episodepipes.sharding.write.writer import ShardWriter

ENCODERS = available_encoders()
LENGTHS = (15, 12, 17)


def test_pyav_can_encode_the_test_videos():
    assert ENCODERS, "this PyAV build has no AV1 or h264 encoder; install PyAV's PyPI wheel (the dev extra)"


def _shard(reader, out, shard_size=40_000):
    with ShardWriter(out, shard_size=shard_size, options={"jpeg_quality": 95}) as w:
        for eid in reader.episode_ids():
            w.add(encode_episode(reader.read(eid), EncodeOptions(jpeg_quality=95)))
    return EpisodeIndex.open(out, verify=True)


def _frame_members(index, ep, f):
    shard, a, b = ep.frame_range(f)
    blob = index.shard_path(shard).read_bytes()[a:b]
    with tarfile.open(fileobj=io.BytesIO(blob)) as t:
        return {m.name.split("/", 1)[1].split(".", 1)[1]: t.extractfile(m).read() for m in t}


@pytest.mark.parametrize("encoder", ENCODERS)
def test_sharded_lerobot_v3_matches_the_source(tmp_path, encoder):
    src = make_lerobot(tmp_path / "lr", lengths=LENGTHS, num_episodes=3, encoder=encoder)
    reader = LeRobotReader(tmp_path / "lr")
    assert isinstance(reader, EpisodeReader)
    assert reader.episode_ids() == ["episode_000000", "episode_000001", "episode_000002"]
    assert len(pickle.dumps(reader)) < 500  # encoder processes get the root, not every episode's metadata
    index = _shard(pickle.loads(pickle.dumps(reader)), tmp_path / "shards")
    assert len(index.shards) > 1  # episodes span shards, as in real runs
    safe = {k: k.replace(".", "_") for k in [*VIDEO_KEYS, IMAGE_KEY]}
    for ep, s in zip(index.episodes, src, strict=True):
        assert (ep.id, ep.length, ep.fps, ep.prompt) == (f"episode_{s.index:06d}", LENGTHS[s.index], 10.0, s.task)
        assert {c.name: c.source for c in ep.cameras.values()} == {v: k for k, v in safe.items()}
        assert {a.name: a.source for a in ep.arrays.values()} == {
            "observation_state": "observation.state", "action": "action", "next_reward": "next.reward",
            "next_done": "next.done"}
        for f in range(ep.length):
            members = _frame_members(index, ep, f)
            for key, arr in s.arrays.items():
                np.testing.assert_array_equal(npy_load(members[f"{key.replace('.', '_')}.npy"]), arr[f])
            assert json.loads(members["json"])["frame"] == f
            for key, name in safe.items():
                got = cv2.cvtColor(cv2.imdecode(np.frombuffer(members[f"{name}.jpg"], np.uint8), 1),
                                   cv2.COLOR_BGR2RGB).astype(np.float32)
                errors = [float(np.abs(got - w).mean()) for w in s.frames[key].astype(np.float32)]
                assert errors[f] < (5 if key == IMAGE_KEY else 12), (ep.id, key, f, errors[f])
                assert int(np.argmin(errors)) == f, (ep.id, key, f, errors)  # the right frame, not a neighbour


@pytest.mark.parametrize("encoder", available_encoders(("av1", "h264", "hevc", "vp9")))
def test_every_codec_with_episodes_starting_mid_gop(tmp_path, encoder):
    # 30-frame GOPs and three episodes per mp4: seeks land on keyframes well before (hevc: open-GOP, after) a start
    src = make_lerobot(tmp_path / "lr", lengths=LENGTHS, num_episodes=3, encoder=encoder, gop=30,
                       episodes_per_file=3, image_feature=False)
    reader = LeRobotReader(tmp_path / "lr")
    for eid, s in zip(reader.episode_ids(), src, strict=True):
        got = np.stack(list(reader.read(eid).cameras["observation_images_front"])).astype(np.float32)
        want = s.frames["observation.images.front"].astype(np.float32)
        errors = np.abs(got[:, None] - want[None]).mean(axis=(2, 3, 4))  # every decoded frame vs every source
        assert errors.diagonal().max() < 12, (eid, errors.diagonal())
        assert (errors.argmin(axis=1) == np.arange(len(want))).all(), eid


def test_decoded_frames_are_pyavs_own_for_each_episodes_range(tmp_path):
    # what lerobot's PyAV backend returns: frame.to_ndarray("rgb24") of the file's frames, episode by episode
    make_lerobot(tmp_path / "lr", lengths=LENGTHS, num_episodes=3, gop=4, episodes_per_file=3, image_feature=False)
    with av.open(str(next((tmp_path / "lr/videos/observation.images.front").rglob("*.mp4")))) as c:
        want = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
    reader, first = LeRobotReader(tmp_path / "lr"), 0
    for eid, n in zip(reader.episode_ids(), LENGTHS, strict=True):
        got = list(reader.read(eid).cameras["observation_images_front"])
        assert len(got) == n and all(np.array_equal(g, w) for g, w in zip(got, want[first:first + n])), eid
        first += n


def test_v21_layout_reads_the_same_episodes(tmp_path):
    src = make_lerobot(tmp_path / "lr", lengths=LENGTHS, num_episodes=3, version="v2.1", image_feature=False)
    reader = LeRobotReader(tmp_path / "lr")
    for eid, s in zip(reader.episode_ids(), src, strict=True):
        ep = reader.read(eid)
        assert ep.prompt == s.task and ep.fps == 10.0
        np.testing.assert_array_equal(ep.arrays["observation_state"], s.arrays["observation.state"])
        for key in VIDEO_KEYS:
            frames = np.stack(list(ep.cameras[key.replace(".", "_")])).astype(np.float32)
            assert np.abs(frames - s.frames[key]).mean() < 10


def test_tasks_come_from_tasks_parquet_when_episode_meta_has_none(tmp_path):
    src = make_lerobot(tmp_path / "lr", num_episodes=2, length=4, image_feature=False)
    path = tmp_path / "lr/meta/episodes/chunk-000/file-000.parquet"
    t = pq.read_table(path)
    pq.write_table(t.set_column(t.schema.get_field_index("tasks"), "tasks", [[None, None]]), path)
    assert LeRobotReader(tmp_path / "lr").read("episode_000001").prompt == src[1].task


def test_match_takes_the_closest_frame_within_tolerance():
    stream = [(t, np.full((1, 1, 3), i, np.uint8)) for i, t in enumerate([0.0, 0.1, 0.2, 0.3])]
    got = [int(a[0, 0, 0]) for a in _match(stream, np.array([0.0, 0.1, 0.20003, 0.3]), 0.0, 1e-4, "w")]
    assert got == [0, 1, 2, 3]
    assert [int(a[0, 0, 0]) for a in _match(stream, np.array([0.04, 0.26]), 0.0, 0.0999, "w")] == [0, 3]
    with pytest.raises(EpisodeError, match=r"w: row 1 \(timestamp 0.150000s"):
        list(_match(stream, np.array([0.0, 0.15]), 0.0, 1e-4, "w"))



def _either(fn, *args):
    try:
        return [int(j) for j in fn(*args)]
    except EpisodeError as e:
        return str(e)


def test_closest_takes_what_match_takes_for_every_query_at_once():
    # the copy path's vectorised rule against the streaming one, on random times, ties, unsorted rows and misses
    rng = np.random.default_rng(0)
    for _ in range(3000):
        times = np.sort(np.round(rng.uniform(0, 1, rng.integers(0, 8)), int(rng.choice([1, 3]))))
        rows = np.round(rng.uniform(-0.1, 1.1, rng.integers(1, 8)), int(rng.choice([1, 3])))
        tol = float(rng.choice([1e-4, 0.05, 0.2, 2.0]))
        items = [(float(t), j) for j, t in enumerate(times)]
        want = _either(_match, items, rows, 0.3, tol, "w")
        assert _either(_closest, times, rows, 0.3, tol, "w") == want, (times, rows, tol)

# --- bad input: each error names the file or episode and the fix ----------------------------------------

def test_missing_meta_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"meta/info.json is missing.*dataset root"):
        LeRobotReader(tmp_path)
    make_lerobot(tmp_path / "lr", num_episodes=1, length=3, image_feature=False)
    (tmp_path / "lr/meta/episodes/chunk-000/file-000.parquet").unlink()
    with pytest.raises(FileNotFoundError, match=r"/meta has no v3.0 episode metadata .*re-download"):
        LeRobotReader(tmp_path / "lr")


def test_unsupported_codebase_version_is_named(tmp_path):
    make_lerobot(tmp_path / "lr", num_episodes=1, length=3, image_feature=False)
    info = tmp_path / "lr/meta/info.json"
    info.write_text(info.read_text().replace('"v3.0"', '"v1.6"'))
    with pytest.raises(ValueError, match=r"codebase_version='v1.6' is not supported.*convert"):
        LeRobotReader(tmp_path / "lr")


def test_features_that_would_share_a_member_name_are_refused(tmp_path):
    make_lerobot(tmp_path / "lr", num_episodes=1, length=3, image_feature=False)
    info = json.loads((tmp_path / "lr/meta/info.json").read_text())
    info["features"]["observation_state"] = {"dtype": "float32", "shape": [7], "names": None}
    (tmp_path / "lr/meta/info.json").write_text(json.dumps(info))
    with pytest.raises(ValueError, match=r"\['observation.state', 'observation_state'\] would share.*rename"):
        LeRobotReader(tmp_path / "lr")


@pytest.mark.parametrize("tolerance_s", [1e-4, 0.1 - 1e-4])
def test_video_shorter_than_its_episode_names_episode_and_timestamp(tmp_path, tolerance_s):
    # episodes 0 and 1 share file-000; its last 2 frames are gone, so episode 1 runs past the video
    make_lerobot(tmp_path / "lr", num_episodes=3, length=6, short_video=2, image_feature=False)
    reader = LeRobotReader(tmp_path / "lr", tolerance_s=tolerance_s)
    ep0 = reader.read("episode_000000")
    assert len(list(ep0.cameras["observation_images_front"])) == 6
    ep1 = reader.read("episode_000001")
    with pytest.raises(EpisodeError, match=r"episode_000001.*file-000.mp4.*row 4 \(timestamp 0.400000s.*shorter"):
        list(ep1.cameras["observation_images_front"])


def test_rows_past_the_episode_video_span_are_refused_before_decoding(tmp_path):
    make_lerobot(tmp_path / "lr", num_episodes=2, length=6, image_feature=False)
    path = tmp_path / "lr/meta/episodes/chunk-000/file-000.parquet"
    t = pq.read_table(path)
    col = "videos/observation.images.wrist/to_timestamp"
    pq.write_table(t.set_column(t.schema.get_field_index(col), col, [[0.5, 1.2]]), path)
    with pytest.raises(EpisodeError, match=r"episode_000000.*wrist.*timestamp 0.500000s lies past.*0.500000s\)"):
        LeRobotReader(tmp_path / "lr").read("episode_000000")


def test_missing_parquet_and_video_are_named(tmp_path):
    make_lerobot(tmp_path / "lr", num_episodes=3, length=4, image_feature=False)
    (tmp_path / "lr/data/chunk-000/file-001.parquet").unlink()
    (tmp_path / "lr/videos/observation.images.wrist/chunk-000/file-000.mp4").unlink()
    reader = LeRobotReader(tmp_path / "lr")
    with pytest.raises(EpisodeError, match=r"episode_000002.*file-001.parquet is missing"):
        reader.read("episode_000002")
    ep = reader.read("episode_000000")
    with pytest.raises(EpisodeError, match=r"episode_000000.*observation.images.wrist.*video file is missing"):
        list(ep.cameras["observation_images_wrist"])
    with pytest.raises(EpisodeError, match=r"'episode_7' is not in"):
        reader.read("episode_7")
    (tmp_path / "lr/videos/observation.images.front/chunk-000/file-000.mp4").write_bytes(b"\0" * 5000)
    with pytest.raises(EpisodeError, match=r"episode_000001.*file-000.mp4.*cannot decode the video"):
        list(reader.read("episode_000001").cameras["observation_images_front"])


def test_rows_disagreeing_with_episode_length_are_refused(tmp_path):
    make_lerobot(tmp_path / "lr", num_episodes=1, length=5, image_feature=False)
    path = tmp_path / "lr/data/chunk-000/file-000.parquet"
    pq.write_table(pq.read_table(path).slice(0, 4), path)
    with pytest.raises(EpisodeError, match=r"episode_000000.*holds 4 rows.*length=5"):
        LeRobotReader(tmp_path / "lr").read("episode_000000")


def test_cli_writes_a_lerobot_dataset_with_worker_processes(tmp_path, capsys):
    src = make_lerobot(tmp_path / "lr", num_episodes=3, length=5, image_feature=False)
    assert cli.main(["write", str(tmp_path / "lr"), str(tmp_path / "out"), "--workers", "2"]) == 0  # auto-detected
    index = EpisodeIndex.open(tmp_path / "out", verify=True)
    assert [(e.id, e.length, e.prompt) for e in index.episodes] == [
        (f"episode_{s.index:06d}", 5, s.task) for s in src]
    info = tmp_path / "lr/meta/info.json"
    info.write_text(info.read_text().replace('"v3.0"', '"v1.6"'))
    assert cli.main(["write", str(tmp_path / "lr"), str(tmp_path / "out2"), "--format", "lerobot"]) == 2
    assert "codebase_version='v1.6' is not supported" in capsys.readouterr().err


def test_decoding_stops_at_the_episode_end_in_a_shared_file(tmp_path, monkeypatch):
    import av

    # both episodes in one mp4 per camera; the last row's float32 timestamp (0.8) lies just past its frame
    make_lerobot(tmp_path / "lr", num_episodes=2, length=9, image_feature=False)
    decoded, real_open = [], av.open

    class Counting:  # the container surface _video_frames uses, counting every decoded frame
        def __init__(self, c):
            self.c, self.streams, self.seek, self.duration = c, c.streams, c.seek, c.duration

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.c.close()

        def decode(self, stream):
            for f in self.c.decode(stream):
                decoded.append(f.time)
                yield f

    monkeypatch.setattr(av, "open", lambda *a, **k: Counting(real_open(*a, **k)))
    ep = LeRobotReader(tmp_path / "lr").read("episode_000000")
    assert len(list(ep.cameras["observation_images_front"])) == 9
    assert max(decoded) <= 0.9 + 1e-6  # one frame of episode 1 (at 0.9 s) at most, not the rest of the file


def test_cli_skip_bad_skips_an_episode_whose_video_is_short(tmp_path, capsys):
    make_lerobot(tmp_path / "lr", num_episodes=3, length=5, short_video=1, image_feature=False)  # ep 1 and 2 short
    assert cli.main(["write", str(tmp_path / "lr"), str(tmp_path / "out"), "--format", "lerobot"]) == 2
    assert "episode_000001" in capsys.readouterr().err
    assert cli.main(["write", str(tmp_path / "lr"), str(tmp_path / "ok"), "--skip-bad", "--workers", "1"]) == 0
    assert [e.id for e in EpisodeIndex.open(tmp_path / "ok").episodes] == ["episode_000000"]
    assert "skipped episode_000002" in capsys.readouterr().out


def test_building_videos_leaves_this_process_scheduling_as_it_was(tmp_path):
    # libsvtav1 run as root switches the encoding thread to SCHED_FIFO 99; every later test, thread and
    # forked worker of this pytest process would inherit it (a busy-polling pool thread then starves)
    import os

    before = (os.sched_getscheduler(0), os.sched_getparam(0))
    make_lerobot(tmp_path / "lr", num_episodes=1, length=3, encoder=ENCODERS[0], image_feature=False)
    assert (os.sched_getscheduler(0), os.sched_getparam(0)) == before
