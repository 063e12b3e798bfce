"""`train_pipe` on a ``--codec reference`` index kept locally, its LeRobot dataset on moto's S3 server (behind the
counting proxy): the batches are those of the local dataset, and the bytes fetched from the mp4 objects are the
packets the samples read (each batch's, back to each camera step's key frame, counted from PyAV's demux of the mp4s,
not from the reader's own statistics), within 10%: the read-ahead's fetch is the one read, none repeated. A step of
the action horizon reads its arrays from the index's rows file, never its record (which holds both cameras'
packets): no byte of the mp4s is fetched for it."""

from __future__ import annotations

import av
import pyarrow.parquet as pq
import pytest
from remotecases import plain

from benchmarks.lerobot_data import VIDEO_KEYS, make_lerobot
from episodepipes.codec.reference import STAMP
from episodepipes.index import EpisodeIndex
from episodepipes.pipes.train import train_pipe
from episodepipes.sharding.cli import main

BUCKET = "reftrain"
FPS, GOP, LENGTHS = 10, 4, (30, 26, 34)
CAMS = [k.replace(".", "_") for k in VIDEO_KEYS]
WINDOWS = dict(history={CAMS[0]: 2}, horizon={"action": 16})


@pytest.fixture(scope="module")
def dataset(moto, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("reftrain")
    src = tmp / "lr"
    make_lerobot(src, lengths=LENGTHS, num_episodes=3, episodes_per_file=3, gop=GOP, encoder="libx264", fps=FPS,
                 height=240, width=320, image_feature=False)
    out = tmp / "ref"
    assert main(["write", str(src), str(out), "--format", "lerobot", "--codec", "reference"]) == 0
    c = moto.client()
    c.create_bucket(Bucket=BUCKET)
    for p in sorted(src.rglob("*")):
        if p.is_file():
            c.put_object(Bucket=BUCKET, Key=f"lr/{p.relative_to(src).as_posix()}", Body=p.read_bytes())
    return src, out


def _packets(src):
    """camera -> (object path under the bucket, its size, [(packet size, is key) in presentation order])."""
    out = {}
    for key, cam in zip(VIDEO_KEYS, CAMS):
        [mp4] = (src / "videos" / key).rglob("*.mp4")
        with av.open(str(mp4)) as c:
            got = sorted((p.pts, p.size, p.is_keyframe) for p in c.demux(video=0) if p.size)
        out[cam] = (f"/{BUCKET}/lr/{mp4.relative_to(src).as_posix()}", mp4.stat().st_size,
                    [(s, k) for _, s, k in got])
    return out


def _used(src, batches, options):
    """Bytes of the packets each batch's samples read, a packet counted once a batch, at the episode's place in its
    mp4 (its from_timestamp). A camera step reads the records from its key frame (PyAV's flag) to itself (a record
    holds every camera's packet of its frame, so a record read is both cameras' packets); a step of arrays only
    (the action horizon) reads no record."""
    meta = pq.read_table(src / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    packets, total = _packets(src), 0
    windows = "history" in options
    for b in batches:
        need = set()
        for e, f in zip(b["episode"], b["frame"]):
            n, t = int(e.rsplit("_", 1)[1]), int(f)
            steps = {t} | ({max(t - 1, 0)} if windows else set())
            records = set()
            for s in steps:
                k = s
                while not all(packets[c][2][_first(meta, n, key) + k][1] for key, c in zip(VIDEO_KEYS, CAMS)):
                    k -= 1
                records.update(range(k, s + 1))
            need.update((c, _first(meta, n, key) + r) for r in records for key, c in zip(VIDEO_KEYS, CAMS))
        total += sum(packets[cam][2][j][0] for cam, j in need)
    return total, packets


def _first(meta, n, key):
    return round(meta[n][f"videos/{key}/from_timestamp"] * FPS)


def _fetched(proxy, packets):
    """(bytes of the mp4 objects' GETs other than the stamp checks, the stamp-check GETs): a stamp check reads the
    first and last `STAMP` bytes of each object once, when it is first opened."""
    ends = {path: size for path, size, _ in packets.values()}
    data, stamps = 0, []
    for _, path, rng in proxy.gets():
        if path not in ends:
            continue
        a, b = (int(x) for x in rng.removeprefix("bytes=").split("-"))
        if b - a + 1 == STAMP and a in (0, ends[path] - STAMP):
            stamps.append((path, a))
        else:
            data += b - a + 1
    return data, stamps


@pytest.mark.parametrize("options", [{}, WINDOWS, dict(shuffle="block", block_frames=8, window_blocks=2)])
def test_training_from_s3_fetches_the_packets_it_uses_once(dataset, proxy, options):
    src, out = dataset
    kw = dict(batch_size=6, seed=5, rank=0, world_size=1, num_workers=1, epochs=1, **options)
    want = plain(train_pipe(EpisodeIndex.open(out, source_root=src), **kw))
    index = EpisodeIndex.open(out, source_root=f"s3://{BUCKET}/lr")
    proxy.reset()
    got = list(train_pipe(index, **kw))
    assert plain(got) == want
    if options.get("shuffle") == "block":  # each window's blocks in one read, once an epoch: count the epoch's
        got = [{k: [x for b in got for x in b[k]] for k in ("episode", "frame")}]
    used, packets = _used(src, got, options)
    fetched, stamps = _fetched(proxy, packets)
    assert sorted(stamps) == sorted((p, a) for p, size, _ in packets.values() for a in (0, size - STAMP))
    videos = sum(size for _, size, _ in packets.values())
    assert videos > 4 * STAMP  # the stamp checks are told apart from the frames' reads
    # one epoch reads every packet at least once; the old reader fetched each batch ahead, then read it again
    assert used <= fetched <= 1.1 * used
