"""The reference section's object-store rows: `train_pipe` on an in-place index whose LeRobot dataset lies on S3
(moto's real server behind the tests' counting proxy, in this process), one shuffled epoch, batch 8.

Fetched: the bytes of the mp4 objects' ranged GETs, less each object's two stamp checks (its first and last 64 KiB,
read once when it is first opened). Used: the packets the batches decode, from PyAV's demux of the mp4s (not the
reader's statistics): each sample's camera steps from their key frame to themselves, a packet counted once a batch.
The windowed row's action horizon is read from the index's rows file (no packet); its history steps read their
records, which carry the other camera's packets too (the record is what a CRC32 checks); its note gives the bytes of
the records read.
"""

from __future__ import annotations

import sys
from pathlib import Path

import av
import pyarrow.parquet as pq

from benchmarks.lerobot_data import VIDEO_KEYS, make_lerobot
from episodepipes.codec.reference import STAMP
from episodepipes.index import EpisodeIndex
from episodepipes.pipes.train import train_pipe
from episodepipes.sharding.cli import main

ROOT = Path(__file__).resolve().parent.parent
FPS, GOP, BATCH = 30, 2, 8
CAMS = [k.replace(".", "_") for k in VIDEO_KEYS]


def _packets(src: Path) -> dict:
    """camera -> (object path, size, [(packet bytes, is key)] in presentation order)."""
    out = {}
    for key, cam in zip(VIDEO_KEYS, CAMS):
        [mp4] = (src / "videos" / key).rglob("*.mp4")
        with av.open(str(mp4)) as c:
            got = sorted((p.pts, p.size, p.is_keyframe) for p in c.demux(video=0) if p.size)
        out[cam] = (f"/ref/lr/{mp4.relative_to(src).as_posix()}", mp4.stat().st_size, [(s, k) for _, s, k in got])
    return out


def _used(src: Path, batches: list[dict], packets: dict, history: int) -> tuple[int, int]:
    """(packets decoded, packets of every record read) in bytes, each counted once a batch."""
    meta = pq.read_table(src / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    first = {(m["episode_index"], c): round(m[f"videos/{k}/from_timestamp"] * FPS)
             for m in meta for k, c in zip(VIDEO_KEYS, CAMS)}
    decoded = records = 0
    for b in batches:
        dec, rec = set(), set()
        for e, f in zip(b["episode"], b["frame"]):
            n, t = int(e.rsplit("_", 1)[1]), int(f)
            for c in CAMS:
                steps = {max(t - k, 0) for k in range(history)} if c == CAMS[0] else {t}
                for s in steps:
                    k = s
                    while not packets[c][2][first[n, c] + k][1]:
                        k -= 1
                    dec.update((c, first[n, c] + j) for j in range(k, s + 1))
                    rec.update((n, j) for j in range(k, s + 1))
        decoded += sum(packets[c][2][j][0] for c, j in dec)
        records += sum(packets[c][2][first[n, c] + j][0] for n, j in rec for c in CAMS)
    return decoded, records


def _fetched(requests: list, packets: dict) -> tuple[int, int]:
    """(bytes of the mp4 GETs other than stamp checks, their GETs)."""
    ends = {p: size for p, size, _ in packets.values()}
    data = gets = 0
    for m, path, rng in requests:
        if m != "GET" or path not in ends:
            continue
        a, b = (int(x) for x in rng.removeprefix("bytes=").split("-"))
        if not (b - a + 1 == STAMP and a in (0, ends[path] - STAMP)):
            data, gets = data + b - a + 1, gets + 1
    return data, gets


def rows(workdir: Path, quick: bool) -> list[dict]:
    sys.path.insert(0, str(ROOT / "tests"))
    from s3server import FaultProxy, MotoS3, restore_env, s3_env, set_env

    src, out = workdir / "s3-lerobot", workdir / "s3-lerobot-ref"
    n = 2 if quick else 4
    make_lerobot(src, lengths=(60,) * n, num_episodes=n, episodes_per_file=n, gop=GOP, encoder="libx264", fps=FPS,
                 height=240, width=320, image_feature=False)
    if main(["write", str(src), str(out), "--format", "lerobot", "--codec", "reference", "--overwrite"]) != 0:
        raise RuntimeError(f"indexing {src} in place failed")
    packets = _packets(src)
    moto = MotoS3()
    proxy = FaultProxy(moto.endpoint)
    old = set_env(s3_env(proxy.endpoint))
    out_rows = []
    try:
        client = moto.client()
        client.create_bucket(Bucket="ref")
        for f in sorted(src.rglob("*")):
            if f.is_file():
                client.put_object(Bucket="ref", Key=f"lr/{f.relative_to(src).as_posix()}", Body=f.read_bytes())
        for label, history, horizon in (("single frames", 1, 1), ("2-image history + 16 actions", 2, 16)):
            kw = {} if history == 1 else {"history": {CAMS[0]: history}, "horizon": {"action": horizon}}
            index = EpisodeIndex.open(out, source_root="s3://ref/lr")
            proxy.reset()
            batches = list(train_pipe(index, batch_size=BATCH, seed=1, rank=0, world_size=1, num_workers=1,
                                      epochs=1, **kw))
            fetched, gets = _fetched(proxy.requests, packets)
            decoded, records = _used(src, batches, packets, history)
            note = f"{gets} ranged GETs for {sum(len(b['frame']) for b in batches)} samples; goal <= 1.1x"
            if horizon > 1:
                note += (f"; the records read (a history step's carry the other camera's packets) hold {records:,} "
                         f"bytes: {fetched / records:.2f}x of those")
            out_rows.append({"metric": f"in-place index on S3, train_pipe {label}: bytes fetched / packets decoded",
                             "ours": fetched / decoded, "baseline": 1.0, "ceiling": 1.1, "unit": "x", "note": note})
    finally:
        proxy.close()
        moto.close()
        restore_env(old)
    return out_rows
