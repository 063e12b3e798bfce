import shutil
import threading

import pytest

from episodepipes.pipes import EpisodeIndex, metric_pipe, video_pipe


@pytest.fixture(scope="module")
def shards(shard_folder):
    return shard_folder("read", num_episodes=6, length=20, height=64, width=96, shard_size=400_000)


def _rchar():
    with open("/proc/self/io") as f:
        return int(dict(line.split(": ") for line in f.read().splitlines())["rchar"])


def test_pinned_read_touches_only_its_episode_bytes(shards):
    index = EpisodeIndex.open(shards)
    ep = index.episode("ep0003")
    shard_bytes = sum(index.shards[s.shard].bytes for s in ep.segments)
    assert shard_bytes > 2 * ep.nbytes  # the shard holds other episodes too
    pipe = video_pipe(index, episodes=["ep0003"], batch_size=8, max_batches=100)
    before = _rchar()
    frames = [f for b in pipe for f in b["frame"].tolist()]
    read = _rchar() - before
    assert frames == list(range(20))
    assert pipe.stats["bytes_read"] == ep.nbytes
    assert read <= 1.1 * ep.nbytes, (read, ep.nbytes)


def test_metric_pipe_reads_only_the_chosen_frames(shards):
    index = EpisodeIndex.open(shards)
    pipe = metric_pipe(index, split="val", frames_per_episode=3, batch_size=4)
    list(pipe)
    want = sum(b - a for e in index.split("val") for f in (3, 10, 16) for _, a, b in [e.frame_range(f)])
    assert pipe.stats["bytes_read"] == want


def test_missing_shard_is_named(shards, tmp_path):
    copy = shutil.copytree(shards, tmp_path / "s")
    (copy / "shard-000001.tar").unlink()
    index = EpisodeIndex.open(copy)
    eid = next(e.id for e in index.episodes if any(s.shard == 1 for s in e.segments))
    pipe = video_pipe(index, episodes=[eid], batch_size=4, max_batches=50)
    before = set(threading.enumerate())
    with pytest.raises(FileNotFoundError, match="shard-000001.tar"):
        list(pipe)
    assert not set(threading.enumerate()) - before  # the failed pass released its workers


def test_truncated_shard_is_named(shards, tmp_path):
    copy = shutil.copytree(shards, tmp_path / "s")
    shard = copy / "shard-000000.tar"
    shard.write_bytes(shard.read_bytes()[:50_000])
    pipe = video_pipe(copy, episodes=["ep0000"], batch_size=4, max_batches=50)
    with pytest.raises(ValueError, match="shard-000000.tar.*truncated"):
        list(pipe)


def test_verify_checks_only_the_shards_it_reads_before_reading(shards, tmp_path):
    copy = shutil.copytree(shards, tmp_path / "s")
    index = EpisodeIndex.open(copy)
    bad_ep = index.episodes[-1].id
    last = index.episode(bad_ep).frame_range(0)[0]
    assert last != index.episode("ep0000").frame_range(7)[0]
    blob = bytearray((copy / index.shards[last].name).read_bytes())
    blob[700] ^= 0xFF
    (copy / index.shards[last].name).write_bytes(bytes(blob))
    ok = video_pipe(index, episodes=["ep0000"], batch_size=4, max_batches=2, verify=True)
    assert len(list(ok)) == 2
    bad = video_pipe(index, episodes=[bad_ep], batch_size=4, max_batches=2, verify=True)
    with pytest.raises(ValueError, match=index.shards[last].name):
        list(bad)
    assert bad.stats["bytes_read"] == 0


def test_frame_parser_matches_webdataset_including_long_names():
    import io

    from webdataset.tariterators import tar_file_iterator

    from episodepipes.format import TAR_END, tar_member
    from episodepipes.tarmembers import frame_fields

    long_id = "x" * 150
    frames = [(eid, f, b"".join(tar_member(f"{eid}/{f:06d}.{field}", bytes([f]) * n)
                                for field, n in (("a.jpg", 700), ("json", 3))))
              for eid in ("ep1", long_id) for f in range(3)]
    blob = b"".join(b for *_, b in frames)
    want = [(m["fname"], m["data"]) for m in tar_file_iterator(io.BytesIO(blob + TAR_END))]
    got, pos = [], 0
    for eid, f, b in frames:
        fields, n = frame_fields(lambda size, off: blob[off:off + size], pos, pos + len(b), eid, f)
        got += [(f"{eid}/{f:06d}.{k}", v) for k, v in fields.items()]
        pos += len(b)
        assert n == len(b)
    assert got == want
    assert any(name.startswith(long_id) for name, _ in want)


def test_local_members_are_slices_of_the_mapped_shard_with_their_crc_left_to_the_decoder(shards, tmp_path):
    import pickle
    import tarfile
    import zlib

    from episodepipes.pipes import ShardReader
    from episodepipes.pipes.decode import portable
    from episodepipes.pipes.plan import Item
    from episodepipes.pipes.sample import crc_mismatch

    index = EpisodeIndex.open(shards)
    ep = index.episode("ep0001")
    items = [Item("ep0001", f) for f in (0, 1, 7)]
    with tarfile.open(shards / index.shards[ep.frame_range(0)[0]].name) as tar:
        want = {m.name: tar.extractfile(m).read() for m in tar if m.name.startswith("ep0001/")}
    raws = list(ShardReader(index, items))
    for raw, item in zip(raws, items):
        assert raw.damaged is None and {"front.jpg", "wrist.jpg", "json"} <= set(raw.members)
        for field, v in raw.members.items():
            assert isinstance(v, memoryview) and bytes(v) == want[f"ep0001/{item.frame:06d}.{field}"]  # no copy
        (step, whole, crc), = raw.checks  # the whole frame, for the decode worker's crc32
        assert step == item.frame and crc == ep.frame_crc(item.frame) == zlib.crc32(whole)
        assert crc_mismatch(raw.checks) is None
        sent = pickle.loads(pickle.dumps(portable(raw)))  # what a decode process gets: bytes, checked here
        assert {k: bytes(v) for k, v in sent.members.items()} == {k: bytes(v) for k, v in raw.members.items()}


@pytest.mark.parametrize("at", [257, 7])  # the first header's ustar magic; its name (another frame's)
def test_a_frame_whose_tar_header_the_fast_path_refuses_is_read_and_checked_as_before(shards, tmp_path, at):
    root = shutil.copytree(shards, tmp_path / "s")
    index = EpisodeIndex.open(root)
    shard, start, _ = index.episode("ep0001").frame_range(3)
    path = root / index.shards[shard].name
    data = bytearray(path.read_bytes())
    data[start + at:start + at + 5] = b"00009"
    path.write_bytes(bytes(data))
    pipe = video_pipe(root, episodes=["ep0001"], batch_size=4, max_batches=10)
    valid = [v for b in pipe for v in b["valid"].tolist()]  # its crc32 fails where the reader checks it
    assert valid == [True] * 3 + [False] + [True] * 16 and pipe.stats["frames_corrupt"] == 2
