"""train_pipe on packed (h264/AV1) shards: frames equal to video_pipe's, windows, CRC32, resume, mixtures."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from helpers import raw_mp4_source, write_raw

from episodepipes.index import EpisodeIndex
from episodepipes.pipes import Source, train_pipe, video_pipe, videoframes
from episodepipes.pipes.train.packed import needed_frames
from episodepipes.pipes.videoframes import key_frame
from episodepipes.sharding.cli import main
from episodepipes.sharding.formats.synthetic import SyntheticReader

READER = SyntheticReader(num_episodes=4, length=9, height=48, width=64)
CAMS = ("front", "wrist")
# a batch tensor over a record's read-only bytes is a bug (collation must copy or use its own rows)
pytestmark = pytest.mark.filterwarnings("error:The given NumPy array is not writable")


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    return write_raw(tmp_path_factory.mktemp("trainvid") / "src", READER)


def _write(src, out, *args):
    assert main(["write", str(src), str(out), "--workers", "1", "--shard-size", "30kB", *args]) == 0
    return out


# its own, not `shard_folder`: three codecs written by the CLI from raw folders (`write --codec`)
@pytest.fixture(scope="module")
def shards(src, tmp_path_factory):
    d = tmp_path_factory.mktemp("trainvid_out")
    return {"h264": _write(src, d / "h264", "--codec", "h264", "--gop", "2"),
            "av1": _write(src, d / "av1", "--codec", "av1", "--gop", "3"),
            "jpeg": _write(src, d / "jpeg")}


def _reference(root):
    """(episode, frame) -> {key: value} of every frame, decoded in order by video_pipe."""
    out = {}
    for b in video_pipe(root, episodes=[f"ep{i:04d}" for i in range(4)], batch_size=9, max_batches=1000,
                        num_workers=1):
        for i, (e, f) in enumerate(zip(b["episode"], b["frame"].tolist())):
            assert bool(b["valid"][i])
            out[e, f] = {k: b[k][i].numpy() for k in (*CAMS, "state", "action")}
    return out


def _samples(pipe):
    return [{k: (v[i].numpy() if hasattr(v, "numpy") else v[i]) for k, v in b.items()}
            for b in pipe for i in range(len(b["episode"]))]


@pytest.mark.parametrize("codec, method", [("h264", "thread"), ("av1", "thread"), ("h264", "process")])
def test_train_batches_equal_the_sequential_decode_of_the_same_frames(shards, codec, method):
    ref = _reference(shards[codec])
    pipe = train_pipe(shards[codec], batch_size=4, seed=1, num_workers=2, method=method)
    got = _samples(pipe)
    assert len(got) == 24 and len({(s["episode"], int(s["frame"])) for s in got}) == 24  # 27 train frames
    for s in got:
        want = ref[s["episode"], int(s["frame"])]
        assert s["valid"]
        for k in (*CAMS, "state", "action"):
            assert np.array_equal(s[k], want[k]), (s["episode"], s["frame"], k)
    assert pipe.stats["frames_corrupt"] == 0


@pytest.mark.parametrize("codec", ["h264", "av1"])
def test_a_camera_history_window_is_the_frames_before_padded_at_the_start(shards, codec):
    ref = _reference(shards[codec])
    pipe = train_pipe(shards[codec], batch_size=3, seed=2, num_workers=2, history={"front": 4, "state": 2},
                      horizon={"action": 3})
    got = _samples(pipe)
    assert {int(s["frame"]) for s in got} == set(range(9))
    for s in got:
        e, t = s["episode"], int(s["frame"])
        steps = np.clip(np.arange(t - 3, t + 1), 0, 8)
        assert s["front"].shape == (4, 3, 48, 64)
        assert s["front_pad"].tolist() == (np.arange(t - 3, t + 1) < 0).tolist()
        for j, step in enumerate(steps):
            assert np.array_equal(s["front"][j], ref[e, int(step)]["front"]), (e, t, j)
        assert np.array_equal(s["wrist"], ref[e, t]["wrist"])
        assert np.array_equal(s["state"], np.stack([ref[e, max(t - 1, 0)]["state"], ref[e, t]["state"]]))
        assert np.array_equal(s["action"], np.stack([ref[e, min(u, 8)]["action"] for u in (t, t + 1, t + 2)]))
        assert s["action_pad"].tolist() == [u > 8 for u in (t, t + 1, t + 2)]


def test_a_step_read_only_for_arrays_reads_its_own_record_not_its_gop(shards):
    idx = EpisodeIndex.open(shards["av1"])
    ep = idx.episode("ep0001")
    frames, arrays_only = needed_frames(idx, ep, 7, {4: {"state.npy"}, 5: {"state.npy"}, 6: {"state.npy"}})
    key = key_frame(idx, "ep0001", 7)
    assert key == 6 and arrays_only == {4, 5, 6}  # gop 3: frame 7 decodes from 6
    assert frames == [4, 5, 6, 7]  # 4 and 5 alone: not their key frame 3
    frames, arrays_only = needed_frames(idx, ep, 7, {5: {"front.av1"}})
    assert frames == [3, 4, 5, 6, 7] and not arrays_only


def _flip(root, episode, frame):
    idx = EpisodeIndex.open(root)
    shard, a, _ = idx.episode(episode).frame_range(frame)
    path = root / idx.shards[shard].name
    data = bytearray(path.read_bytes())
    data[a] ^= 0xFF
    path.write_bytes(bytes(data))


def _copy(root, to):
    return shutil.copytree(root, to)


def test_a_corrupt_record_makes_the_samples_that_read_it_invalid_or_raises(shards, tmp_path):
    root = _copy(shards["h264"], tmp_path / "bad")
    _flip(root, "ep0001", 4)  # a key frame (gop 2): frames 4 and 5 read its record; with history 2, also 6 (via 5)
    idx = EpisodeIndex.open(root)
    pipe = train_pipe(root, batch_size=4, seed=3, num_workers=2, history={"front": 2})
    got = _samples(pipe)
    bad = {(s["episode"], int(s["frame"])) for s in got if not s["valid"]}
    needs = {("ep0001", t) for t in range(9) if any(key_frame(idx, "ep0001", s) <= 4 <= s
                                                    for s in {max(t - 1, 0), t})}
    assert bad == needs == {("ep0001", t) for t in (4, 5, 6)}
    assert pipe.stats["frames_corrupt"] == 3 * len(CAMS)
    assert all(not s["front"].any() for s in got if not s["valid"])
    with pytest.raises(ValueError, match="crc32"):
        list(train_pipe(root, batch_size=4, seed=3, num_workers=1, on_corrupt="raise"))


def test_an_array_only_step_with_a_corrupt_record_is_invalid_too(shards, tmp_path):
    root = _copy(shards["h264"], tmp_path / "bad")
    _flip(root, "ep0000", 3)
    got = _samples(train_pipe(root, batch_size=4, seed=3, num_workers=1, horizon={"state": 2}))
    bad = {(s["episode"], int(s["frame"])) for s in got if not s["valid"]}
    assert bad == {("ep0000", 2), ("ep0000", 3)}  # 2 reads record 3 for its state only


def _keys(batches):
    return [(e, f) for b in batches for e, f in zip(b["episode"], b["frame"].tolist())]


def test_resume_mid_epoch_gives_the_same_batches(shards):
    kw = dict(batch_size=3, seed=5, num_workers=2, history={"front": 3}, epochs=2)
    full = list(train_pipe(shards["h264"], **kw))
    pipe = train_pipe(shards["h264"], **kw)
    it = iter(pipe)
    for _ in range(5):
        next(it)
    state = pipe.state_dict()
    other = train_pipe(shards["h264"], **kw)
    other.load_state_dict(state)
    rest = list(other)
    assert len(full) == 18 and _keys(rest) == _keys(full[5:])
    for a, b in zip(rest, full[5:]):
        assert np.array_equal(a["front"].numpy(), b["front"].numpy())


def test_a_mixture_of_a_jpeg_and_an_h264_source_stacks_each_sources_frames(shards):
    jpeg, h264 = _reference(shards["jpeg"]), _reference(shards["h264"])
    pipe = train_pipe({"j": Source(shards["jpeg"], 0.5), "v": Source(shards["h264"], 0.5)}, batch_size=4, seed=0,
                      num_workers=2, history={"front": 2})
    n = 0
    for b in pipe:
        assert b["front"].shape == (4, 2, 3, 48, 64) and b["wrist"].shape == (4, 3, 48, 64)
        for i, (name, e, t) in enumerate(zip(b["source"], b["episode"], b["frame"].tolist())):
            ref = jpeg if name == "j" else h264
            assert bool(b["valid"][i])
            assert np.array_equal(b["wrist"][i].numpy(), ref[e, t]["wrist"])
            assert np.array_equal(b["front"][i, 0].numpy(), ref[e, max(t - 1, 0)]["front"])
            assert np.array_equal(b["front"][i, 1].numpy(), ref[e, t]["front"])
            n += 1
    assert n == 4 * len(pipe) and pipe.stats["frames_corrupt"] == 0


def test_a_mixture_renamed_with_keys_reads_the_video_source(shards):
    h264 = _reference(shards["h264"])
    keys = {"front": "cam", "state": "state", "action": "action"}
    pipe = train_pipe({"j": Source(shards["jpeg"], 0.5, keys=keys), "v": Source(shards["h264"], 0.5, keys=keys)},
                      batch_size=2, seed=0, num_workers=1, epochs=1)
    seen = 0
    for b in pipe:
        assert "wrist" not in b and b["cam"].shape == (2, 3, 48, 64)
        for i, (name, e, t) in enumerate(zip(b["source"], b["episode"], b["frame"].tolist())):
            assert bool(b["valid"][i])
            if name == "v":
                assert np.array_equal(b["cam"][i].numpy(), h264[e, t]["front"])
                seen += 1
    assert seen >= 20


def test_video_cameras_in_the_older_members_layout_are_refused_by_name(shards, tmp_path):
    root = _copy(shards["h264"], tmp_path / "members")
    d = json.loads((root / "index.json").read_text())
    d["layout"] = "members"
    for c in ("member", "key"):
        d["columns"].pop(c)
    (root / "index.json").write_text(json.dumps(d))
    with pytest.raises(ValueError, match=r"cameras \['front', 'wrist'\] .* older members layout.*re-shard"):
        train_pipe(root, batch_size=2, seed=0)
    with pytest.raises(ValueError, match=r"source 'v' .* older members layout"):
        train_pipe({"j": Source(shards["jpeg"], 0.5), "v": Source(root, 0.5)}, batch_size=2, seed=0)


def test_copied_shards_give_pyav_s_own_decode_of_the_source_in_windows(tmp_path):
    synth = SyntheticReader(num_episodes=3, length=10, height=48, width=64, cameras=("front", "wrist"))
    src, want = raw_mp4_source(tmp_path / "src", synth)
    out = tmp_path / "out"
    assert main(["write", str(src), str(out), "--codec", "copy", "--workers", "1", "--shard-size", "8kB"]) == 0
    pipe = train_pipe(out, batch_size=2, seed=0, num_workers=2, history={"front": 3})
    n = 0
    for s in _samples(pipe):
        e, t = s["episode"], int(s["frame"])
        assert s["valid"] and np.array_equal(s["wrist"].transpose(1, 2, 0), want[e, t, "wrist"])
        for j, step in enumerate(np.clip(np.arange(t - 2, t + 1), 0, 9).tolist()):
            assert np.array_equal(s["front"][j].transpose(1, 2, 0), want[e, step, "front"]), (e, t, j)
        n += 1
    assert n == 2 * len(pipe) > 0


def _decoded(camera):
    return sum(p.decoded for k, p in videoframes._POOLS.items() if k[0] == camera)


def test_a_window_decodes_each_packet_of_its_range_once(shards):
    """History 4 at GOP 2 spans up to three GOPs: decoded in order, its packets are those from the earliest step's
    key frame to the current step, not a GOP per step (which would decode each keyframe again)."""
    idx = EpisodeIndex.open(shards["h264"])
    pipe = train_pipe(shards["h264"], batch_size=1, seed=7, num_workers=1, history={"front": 4})
    per_step = one_range = 0
    before = _decoded("front")
    for s in _samples(pipe):
        e, t = s["episode"], int(s["frame"])
        steps = sorted(set(np.clip(np.arange(t - 3, t + 1), 0, 8).tolist()))
        one_range += t - key_frame(idx, e, steps[0]) + 1
        per_step += sum(u - key_frame(idx, e, u) + 1 for u in steps)
        assert s["valid"]
    assert _decoded("front") - before <= one_range < per_step


def test_the_order_and_state_are_the_jpeg_shards_of_the_same_episodes(shards):
    kw = dict(batch_size=2, seed=9, num_workers=1, rank=1, world_size=2, history={"front": 2, "state": 3})
    video, jpeg = train_pipe(shards["h264"], **kw), train_pipe(shards["jpeg"], **kw)
    assert _keys(video) == _keys(jpeg) and len(video) == len(jpeg) == 6
    assert video.state_dict() == jpeg.state_dict()
    elastic = train_pipe(shards["h264"], **{**kw, "rank": 0, "world_size": 1, "batch_size": 4})
    elastic.load_state_dict(_state_after_steps(train_pipe(shards["h264"], **kw), 2))  # a state of world size 2
    assert _keys(elastic) == _keys(train_pipe(shards["jpeg"], **{**kw, "rank": 0, "world_size": 1,
                                                                  "batch_size": 4}))[8:]  # 2 steps of 4


def _state_after_steps(pipe, n):
    it = iter(pipe)
    for _ in range(n):
        next(it)
    return pipe.state_dict()


def test_a_jpeg_camera_beside_copied_ones_trains_in_processes(tmp_path):
    from benchmarks.lerobot_data import IMAGE_KEY, VIDEO_KEYS, make_lerobot

    make_lerobot(tmp_path / "lr", lengths=(9, 7), num_episodes=2, episodes_per_file=2, gop=4, encoder="libx264")
    out = tmp_path / "out"
    assert main(["write", str(tmp_path / "lr"), str(out), "--codec", "copy", "--workers", "1"]) == 0
    cams = [k.replace(".", "_") for k in (*VIDEO_KEYS, IMAGE_KEY)]
    ids = [e.id for e in EpisodeIndex.open(out).episodes]
    assert EpisodeIndex.open(out).episode(ids[0]).cameras[cams[-1]].codec == "jpeg"
    ref = {(e, f): {c: b[c][i].numpy() for c in cams} for b in video_pipe(out, episodes=ids, batch_size=4,
                                                                           max_batches=100)
           for i, (e, f) in enumerate(zip(b["episode"], b["frame"].tolist()))}
    pipe = train_pipe(out, split=EpisodeIndex.open(out).episode(ids[0]).split, batch_size=2, seed=0, num_workers=2,
                      method="process", history={cams[0]: 2, cams[-1]: 2})
    got = _samples(pipe)
    assert got
    for s in got:
        e, t = s["episode"], int(s["frame"])
        assert s["valid"]
        for c in cams:
            if c in (cams[0], cams[-1]):
                assert np.array_equal(s[c][0], ref[e, max(t - 1, 0)][c]) and np.array_equal(s[c][1], ref[e, t][c])
            else:
                assert np.array_equal(s[c], ref[e, t][c])
