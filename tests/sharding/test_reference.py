"""``write --format lerobot --codec reference``: a LeRobot dataset indexed in place and read through every pipe, frame
by frame equal to PyAV's own decode of the source mp4, arrays equal to the parquet; the index is the copy import's."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import decode_rgb, raw_mp4_source

from benchmarks.lerobot_data import VIDEO_KEYS, make_lerobot
from episodepipes.index import EpisodeIndex
from episodepipes.pipes import Source, metric_pipe, video_pipe
from episodepipes.pipes.train import train_pipe
from episodepipes.sharding.cli import main
from episodepipes.sharding.formats.synthetic import SyntheticReader

LENGTHS = (9, 7, 11)  # at GOP 4, in v3's one shared mp4 episodes 1 and 2 start mid-GOP (frames 9 and 16)
CAMS = [k.replace(".", "_") for k in VIDEO_KEYS]


def _dataset(root, version="v3.0", encoder="libsvtav1"):
    return make_lerobot(root, lengths=LENGTHS, num_episodes=3, episodes_per_file=3, gop=4, encoder=encoder,
                        version=version, image_feature=False)


def _write(src, out, codec, *args):
    assert main(["write", str(src), str(out), "--format", "lerobot", "--codec", codec, "--shard-size", "8kB",
                 *args]) == 0
    return out


def _truth(src, index, version):
    """(episode, frame, camera) -> the frame PyAV decodes from the source mp4 at the episode's place in it."""
    want = {}
    if version == "v3.0":
        meta = pq.read_table(src / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    for key, cam in zip(VIDEO_KEYS, CAMS):
        if version == "v3.0":
            frames = decode_rgb(next((src / "videos" / key).rglob("*.mp4")))
            for m, ep in zip(meta, index.episodes, strict=True):
                first = round(m[f"videos/{key}/from_timestamp"] * 10)
                want.update({(ep.id, t, cam): frames[first + t] for t in range(ep.length)})
        else:
            for k, ep in enumerate(index.episodes):
                frames = decode_rgb(src / f"videos/chunk-000/{key}/episode_{k:06d}.mp4")
                want.update({(ep.id, t, cam): frames[t] for t in range(ep.length)})
    return want


def _frames(batches, cams=CAMS):
    return {(e, int(f), c): (img.numpy().transpose(1, 2, 0), bool(v)) for b in batches for c in cams
            for e, f, img, v in zip(b["episode"], b["frame"], b[c], b["valid"])}


def _same(got, want):
    assert got
    for k, (img, valid) in got.items():
        assert valid and np.array_equal(img, want[k]), k


@pytest.mark.parametrize(("version", "encoder"), [("v3.0", "libsvtav1"), ("v3.0", "libx264"), ("v2.1", "libsvtav1")])
def test_the_reference_index_is_the_copy_imports_without_its_frames(tmp_path, version, encoder):
    src = tmp_path / "lr"
    _dataset(src, version, encoder)
    copy, ref = _write(src, tmp_path / "copy", "copy"), _write(src, tmp_path / "ref", "reference")
    c, r = EpisodeIndex.open(copy), EpisodeIndex.open(ref, source_root=src)
    for name in ("episodes", "segments", "offset", "size", "crc32", "member", "key"):
        assert np.array_equal(c.tables.columns[name], r.tables.columns[name]), name
    assert [(s.name, s.bytes, s.sha256) for s in c.shards] == [(s.name, s.bytes, s.sha256) for s in r.shards]
    assert not list(ref.glob("*.tar"))  # no frame written: the shards are read from the source mp4s
    for s in r.shards:  # the virtual shard is byte for byte the copy's tar
        assert hashlib.sha256(r.source.read(s.name, 0, s.bytes)).hexdigest() == s.sha256
    rng = np.random.default_rng(0)
    for s in r.shards:  # many ranges in one call (empty, touching, overlapping, across pieces) as the tar's slices
        tar = (copy / s.name).read_bytes()
        at = rng.integers(0, s.bytes, 40)
        ranges = [(int(a), int(rng.integers(0, s.bytes - a + 1)) if k % 4 else 0) for k, a in enumerate(at)]
        ranges += [(0, s.bytes), (s.bytes, 0)]
        assert r.source.read_ranges(s.name, ranges) == [tar[a:a + n] for a, n in ranges]
        assert r.source.read_ranges(s.name, [(3, 0), (s.bytes, 0)]) == [b"", b""]
    assert json.loads((ref / "index.json").read_text())["options"]["codec"] == "reference"
    r.verify()
    assert r.problems(members=True) == []
    assert r.stats("observation_state")["count"] == c.stats("observation_state")["count"] == sum(LENGTHS)


def test_every_pipe_reads_the_source_frames_and_the_parquet_arrays(tmp_path):
    src = tmp_path / "lr"
    truth = _dataset(src)
    out = _write(src, tmp_path / "ref", "reference")
    index = EpisodeIndex.open(out, source_root=src)
    want = _truth(src, index, "v3.0")
    seq = _frames(video_pipe(index, episodes=[e.id for e in index.episodes], batch_size=5, max_batches=100))
    assert seq.keys() == want.keys()
    _same(seq, want)
    sparse = _frames(metric_pipe(index, split="train", frames_per_episode=3, batch_size=2, num_workers=2))
    assert any(f % 4 for _, f, _ in sparse)  # mid-GOP frames, decoded from the keyframe before them
    _same(sparse, want)
    windows = metric_pipe(index, split="train", frames_per_episode=2, batch_size=2, history={CAMS[0]: 2},
                          horizon={"action": 3})
    for b in windows:
        for e, f, clip in zip(b["episode"], b["frame"], b[CAMS[0]]):
            for k, img in enumerate(clip):  # the window's steps f-1, f (padded at 0 by the first frame)
                assert np.array_equal(img.numpy().transpose(1, 2, 0), want[e, max(int(f) - 1 + k, 0), CAMS[0]])
    pipe = train_pipe(index, split="train", batch_size=4, seed=0, epochs=1, history={CAMS[0]: 2},
                      horizon={"action": 4})
    seen = 0
    for b in pipe:
        for j, (e, f) in enumerate(zip(b["episode"], b["frame"])):
            n = int(e.split("_")[-1])
            assert np.array_equal(b[CAMS[1]][j].numpy().transpose(1, 2, 0), want[e, int(f), CAMS[1]])
            acts = truth[n].arrays["action"]
            for k in range(4):  # the horizon's actions, from the parquet, the last one repeated past the end
                assert np.allclose(b["action"][j][k].numpy(), acts[min(int(f) + k, len(acts) - 1)])
            seen += 1
    assert seen == len(pipe) * 4 > 0
    mix = train_pipe({"ref": Source(index, 1), "copy": Source(_write(src, tmp_path / "copy", "copy"), 1)},
                     split="train", batch_size=4, seed=0, epochs=1)
    for b in mix:
        for j, (e, f) in enumerate(zip(b["episode"], b["frame"])):
            assert np.array_equal(b[CAMS[0]][j].numpy().transpose(1, 2, 0), want[e, int(f), CAMS[0]])


def test_an_index_inside_the_source_root_opens_without_one_and_the_cli_reads_it(tmp_path, capsys):
    src = tmp_path / "lr"
    _dataset(src)
    inside = _write(src, src / "episodepipes", "reference")
    index = EpisodeIndex.open(inside)  # its root: the folder above the index's
    want = _truth(src, index, "v3.0")
    _same(_frames(video_pipe(inside, episodes=[index.episodes[1].id], batch_size=4, max_batches=10)), want)
    assert main(["verify", str(inside)]) == 0
    assert main(["info", str(inside)]) == 0
    assert main(["stats", str(inside)]) == 0
    outside = _write(src, tmp_path / "ref", "reference")
    with pytest.raises(ValueError, match="source_root=SRC"):
        list(video_pipe(outside, episodes=[index.episodes[0].id], batch_size=4, max_batches=10))
    assert main(["verify", str(outside), "--source-root", str(src)]) == 0
    capsys.readouterr()
    assert main(["verify", str(outside)]) == 2
    assert "source_root" in capsys.readouterr().err


def test_raw_camera_mp4_folders_are_indexed_in_place_as_copy_shards(tmp_path):
    src, want = raw_mp4_source(tmp_path / "raw", SyntheticReader(num_episodes=3, length=10, height=48, width=64,
                                                                 cameras=("front", "wrist")))
    assert main(["write", str(src), str(tmp_path / "copy"), "--format", "raw", "--codec", "copy"]) == 0
    out = tmp_path / "ref"
    assert main(["write", str(src), str(out), "--format", "raw", "--codec", "reference"]) == 0
    c, r = EpisodeIndex.open(tmp_path / "copy"), EpisodeIndex.open(out, source_root=src)
    for name in ("offset", "size", "crc32", "member", "key"):
        assert np.array_equal(c.tables.columns[name], r.tables.columns[name]), name
    got = _frames(video_pipe(r, episodes=[e.id for e in r.episodes], batch_size=4, max_batches=100), ["front", "wrist"])
    assert got.keys() == want.keys()
    _same(got, want)
    assert r.problems(members=True) == []


def test_the_statistics_are_the_copy_imports_byte_for_byte_a_bad_episode_named_alike(tmp_path):
    """The in-place index folds a run of episodes' statistics in one pass; the copy import one episode at a time.
    Equal side files, also where a middle episode has a NaN (its reason names that episode, as the copy's does)."""
    src = tmp_path / "lr"
    make_lerobot(src, lengths=(6, 5, 7, 4), num_episodes=4, episodes_per_file=2, gop=2, encoder="libx264",
                 image_feature=False)
    copy, ref = _write(src, tmp_path / "copy", "copy"), _write(src, tmp_path / "ref", "reference")
    assert (copy / "index.stats.bin").read_bytes() == (ref / "index.stats.bin").read_bytes()
    data = sorted((src / "data").rglob("*.parquet"))[1]  # episodes 2 and 3: the NaN in episode 3's second row
    table = pq.read_table(data)
    state = table.column("observation.state").to_pylist()
    row = next(k for k, e in enumerate(table.column("episode_index").to_pylist()) if e == 3) + 1
    state[row] = [float("nan")] * len(state[row])
    pq.write_table(table.set_column(table.schema.get_field_index("observation.state"), "observation.state",
                                    pa.array(state, table.schema.field("observation.state").type)), data)
    copy = _write(src, tmp_path / "copy2", "copy")
    ref = _write(src, tmp_path / "ref2", "reference")
    assert (copy / "index.stats.bin").read_bytes() == (ref / "index.stats.bin").read_bytes()
    index = EpisodeIndex.open(ref, source_root=src)
    with pytest.raises(Exception, match="episode_000003"):
        index.stats("observation_state")
    assert index.stats("action")["count"] == 22
