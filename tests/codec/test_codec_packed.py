"""The packed layout: copied packets (contract C1) stored as they are and read back frame-exact; chunk framing."""

from __future__ import annotations

import av
import numpy as np
import pyarrow.parquet as pq
import pytest

from benchmarks.lerobot_data import VIDEO_KEYS, make_lerobot
from episodepipes.codec import copy_packets
from episodepipes.codec.chunk import spans
from episodepipes.format import safe_field
from episodepipes.index import EpisodeIndex
from episodepipes.pipes import metric_pipe, video_pipe
from episodepipes.sharding.episode import EpisodeData
from episodepipes.sharding.formats.synthetic import SyntheticReader
from episodepipes.sharding.write.encode import EncodeOptions, encode_episode
from episodepipes.sharding.write.writer import ShardWriter

LENGTHS = (5, 7, 6)  # at GOP 4 in one shared mp4, episodes 1 and 2 start mid-GOP (frames 5 and 12)


def _direct(path):
    with av.open(str(path)) as c:
        s = c.streams.video[0]
        return [(float(f.pts * s.time_base), f.to_ndarray(format="rgb24")) for f in c.decode(s)]


def _copied(root, encoder):
    """The episodes of a LeRobot-style mp4 shared by three episodes, as copied packets, and each one's frames as
    a decode of the whole file gives them."""
    make_lerobot(root, num_episodes=3, lengths=LENGTHS, episodes_per_file=3, gop=4, encoder=encoder,
                 image_feature=False)
    meta = pq.read_table(root / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    eps, want = [], {}
    for k, m in enumerate(meta):
        packets, frames = {}, {}
        for key in VIDEO_KEYS:
            path = root / f"videos/{key}/chunk-000/file-000.mp4"
            start, end = m[f"videos/{key}/from_timestamp"], m[f"videos/{key}/to_timestamp"]
            packets[key] = copy_packets(path, start=start, end=end)
            frames[safe_field(key)] = [f for t, f in _direct(path) if start - 0.05 <= t < end - 0.05]
        n = LENGTHS[k]
        eid = f"ep{k}"
        eps.append(EpisodeData(eid, {}, {"state": np.arange(n * 2, dtype="<f4").reshape(n, 2) + k}, 10.0,
                               packets=packets))
        want[eid] = frames
    return eps, want


def _shards(out, eps, shard_size):
    with ShardWriter(out, shard_size=shard_size, options={"codec": "copy"}) as w:
        for ep in eps:
            w.add(encode_episode(ep, EncodeOptions(codec="copy")))
    return EpisodeIndex.open(out)


def _got(batches):
    return {(e, int(f)): {c: b[c][i].numpy().transpose(1, 2, 0) for c in map(safe_field, VIDEO_KEYS)} | {
        "state": b["state"][i].numpy(), "valid": bool(b["valid"][i])}
        for b in batches for i, (e, f) in enumerate(zip(b["episode"], b["frame"]))}


@pytest.mark.parametrize("encoder", ["libx264", "libsvtav1"])
def test_copied_packets_with_leading_ones_read_back_frame_exact(tmp_path, encoder):
    eps, want = _copied(tmp_path / "src", encoder)
    assert [p.lead for p in (e.packets[VIDEO_KEYS[0]] for e in eps)] == [0, 1, 0]
    ix = _shards(tmp_path / "out", eps, shard_size=1)  # a shard per chunk: GOPs never straddle shards
    assert ix.meta["layout"] == "packed" and len(ix.shards) == 3
    cam = ix.episode("ep1").cameras[safe_field(VIDEO_KEYS[0])]
    assert cam.codec == {"libx264": "h264", "libsvtav1": "av1"}[encoder]
    assert (cam.extradata[:1] == b"\x01") == (encoder == "libx264")  # the mp4's avcC, kept for the decoder
    for pipe in (video_pipe(ix.root, episodes=["ep0", "ep1", "ep2"], batch_size=4, max_batches=100),
                 metric_pipe(ix.root, frames_per_episode=2, batch_size=2, split="train")):
        got = _got(pipe)
        assert got and pipe.stats["frames_corrupt"] == 0
        for (e, f), g in got.items():
            assert g["valid"] and np.array_equal(g["state"], [2 * f + int(e[-1]), 2 * f + 1 + int(e[-1])])
            for c in map(safe_field, VIDEO_KEYS):
                assert np.array_equal(g[c], want[e][c][f]), (e, f, c)


def test_a_frame_after_leading_packets_reads_from_its_chunk_start(tmp_path):
    eps, _ = _copied(tmp_path / "src", "libx264")
    ix = _shards(tmp_path / "out", eps, shard_size=1 << 20)
    ep = ix.episode("ep1")  # starts one frame after a keyframe: frame 0's record holds that leading packet
    keys = ix.tables.columns["key"][ep.rows.start:ep.rows.stop] - ep.rows.start
    assert keys.tolist() == [0, 0, 0, 3, 3, 3, 3]  # frame 3 is the next keyframe (source frame 8)
    pipe = metric_pipe(ix.root, frames_per_episode=1, batch_size=1, split="train")
    got = _got(pipe)
    assert (("ep1", 3) in got) and pipe.stats["frames_corrupt"] == 0
    # ep0 frame 2 reads records 0..2, ep1 frame 3 only itself, ep2 frame 3 records 0..3
    size = ix.tables.size
    rows = {e.id: e.rows for e in ix.episodes}
    assert pipe.stats["bytes_read"] == int(size[rows["ep0"][0]:rows["ep0"][3]].sum()
                                           + size[rows["ep1"][3]] + size[rows["ep2"][0]:rows["ep2"][4]].sum())


def test_spans_find_every_record_the_encoder_laid_out(tmp_path):
    eps, _ = _copied(tmp_path / "src", "libx264")
    enc = encode_episode(eps[1], EncodeOptions(codec="copy"))
    sp = spans(enc.data(), where="test")
    assert sp.spans == enc.sizes and sum(sp.ends) >= 1 and sp.ends[-1]
    assert sp.keys == [0, 0, 0, 3, 3, 3, 3]


def test_threads_of_a_pass_decode_each_packet_once(tmp_path):
    from episodepipes.pipes import videoframes

    reader = SyntheticReader(num_episodes=2, height=32, width=48, lengths=(40, 33), cameras=("front",))
    with ShardWriter(tmp_path / "s", shard_size=1 << 20, options={}) as w:
        for eid in reader.episode_ids():
            w.add(encode_episode(reader.read(eid), EncodeOptions(codec="h264", gop=2)))
    videoframes._POOLS.clear()
    pipe = video_pipe(tmp_path / "s", episodes=["ep0000", "ep0001"], batch_size=8, max_batches=100, num_workers=2)
    assert sum(len(b["frame"]) for b in pipe) == 73 and pipe.stats["frames_corrupt"] == 0
    [pool] = videoframes._POOLS.values()
    # no keyframe decoded again by the thread that got the frame after it, even when one thread stalls and the
    # other runs ahead by the whole prefetch window (the pool keeps a decoder per GOP in flight)
    assert pool.decoded == 73


def _long_gop_shards(out, cameras=("front",)):
    reader = SyntheticReader(num_episodes=2, height=32, width=48, lengths=(80, 45), cameras=cameras)
    with ShardWriter(out, shard_size=1 << 20, options={}) as w:
        for eid in reader.episode_ids():
            w.add(encode_episode(reader.read(eid), EncodeOptions(codec="h264", gop=16)))
    return EpisodeIndex.open(out)


def _frames(pipe):
    return [(e, int(f), b["front"][i].numpy().copy()) for b in pipe for i, (e, f) in
            enumerate(zip(b["episode"], b["frame"]))]


def test_two_threads_decode_different_gops_and_never_share_one(tmp_path):
    """GOPs of 16 and 8 samples a task: on one shared queue a GOP's second task went to the other thread, which
    waited for the GOP's decoder and went on from where the first stopped (every GOP changed threads)."""
    from episodepipes.pipes import videoframes

    ix = _long_gop_shards(tmp_path / "s")
    assert ix.meta["layout"] == "packed"
    videoframes._POOLS.clear()
    one = _frames(video_pipe(ix.root, episodes=["ep0000", "ep0001"], batch_size=8, max_batches=100, num_workers=1))
    videoframes._POOLS.clear()
    pipe = video_pipe(ix.root, episodes=["ep0000", "ep0001"], batch_size=8, max_batches=100, num_workers=2)
    two = _frames(pipe)
    [pool] = videoframes._POOLS.values()
    assert pool.handoffs == 0 and pool.decoded == 125 and pipe.stats["frames_corrupt"] == 0
    assert [(e, f) for e, f, _ in two] == [(e, f) for e, f, _ in one] == [
        *(("ep0000", f) for f in range(80)), *(("ep0001", f) for f in range(45))]
    assert all(np.array_equal(a[2], b[2]) for a, b in zip(one, two))
    for method in ("process", "thread"):  # resumed mid-GOP, mid-pass: the rest of the pass, frame-exact
        pipe = video_pipe(ix.root, episodes=["ep0000", "ep0001"], batch_size=8, max_batches=100, num_workers=2,
                          method=method)
        it = iter(pipe)
        head = [next(it) for _ in range(3)]
        state = pipe.state_dict()
        pipe.close()
        del head
        pipe.load_state_dict(state)
        rest = _frames(pipe)
        assert [(e, f) for e, f, _ in rest] == [(e, f) for e, f, _ in one[24:]], method
        assert all(np.array_equal(a[2], b[2]) for a, b in zip(one[24:], rest)), method


def test_a_long_episode_id_gets_a_longname_chunk_header_that_reads_and_verifies(tmp_path):
    ep = SyntheticReader(num_episodes=1, height=32, width=48, lengths=(70,), cameras=("front",)).read("ep0000")
    ep.id = "x" * 120  # a member name past tar's 100 bytes: a GNU longname header before each chunk's own
    with ShardWriter(tmp_path / "s", shard_size=1 << 20, options={}) as w:
        w.add(encode_episode(ep, EncodeOptions(codec="h264", gop=4)))
    ix = EpisodeIndex.open(tmp_path / "s", verify=True)
    assert ix.problems(members=True) == [] and len(set(ix.tables.columns["member"].tolist())) == 2
    assert int(ix.tables.offset[0] - ix.tables.columns["member"][0]) > 1024  # longname header, its name, the header
    pipe = video_pipe(ix.root, episodes=[ep.id], batch_size=35, max_batches=2)
    assert sum(bool(v) for b in pipe for v in b["valid"]) == 70 and pipe.stats["frames_corrupt"] == 0
