"""Shared test helpers: data is made in tmp_path by the project's own writer. Add, don't change."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from episodepipes.sharding.formats.synthetic import SyntheticReader
from episodepipes.sharding.write.encode import EncodeOptions, encode_episode
from episodepipes.sharding.write.writer import ShardWriter


def make_shards(out: Path, *, shard_size: int = 1 << 20, quality: int = 90, **reader_kw: object) -> Path:
    """Shard a `SyntheticReader(**reader_kw)` into ``out`` in-process and return ``out``."""
    reader = SyntheticReader(**reader_kw)  # type: ignore[arg-type]
    with ShardWriter(out, shard_size=shard_size, options={"jpeg_quality": quality}) as w:
        for eid in reader.episode_ids():
            w.add(encode_episode(reader.read(eid), EncodeOptions(jpeg_quality=quality)))
    return Path(out)


def write_raw(src: Path, reader: SyntheticReader, *, video_cams: tuple[str, ...] = (), meta_fps: bool = True) -> Path:
    """Write ``reader``'s episodes as raw folders: mp4 for ``video_cams``, png folders for the rest."""
    import json

    import cv2
    import numpy as np

    for eid in reader.episode_ids():
        ep, d = reader.read(eid), Path(src) / eid
        d.mkdir(parents=True)
        for cam, frames in ep.cameras.items():
            frames = list(frames)
            if cam in video_cams:
                h, w = frames[0].shape[:2]
                vw = cv2.VideoWriter(str(d / f"{cam}.mp4"), cv2.VideoWriter_fourcc(*"mp4v"), ep.fps, (w, h))
                for f in frames:
                    vw.write(cv2.cvtColor(f, cv2.COLOR_RGB2BGR))
                vw.release()
            else:
                (d / cam).mkdir()
                for i, f in enumerate(frames):
                    cv2.imwrite(str(d / cam / f"{i:06d}.png"), cv2.cvtColor(f, cv2.COLOR_RGB2BGR))
        np.savez(d / "arrays.npz", **ep.arrays)
        meta = {"prompt": ep.prompt, "split": ep.split, **({"fps": ep.fps} if meta_fps else {})}
        (d / "meta.json").write_text(json.dumps(meta))
    return Path(src)


def write_zarr(src: Path, reader: SyntheticReader) -> Path:
    """Write ``reader``'s episodes as ``<id>.zarr`` groups (images/<camera>, arrays, attrs)."""
    import numpy as np
    import zarr

    for eid in reader.episode_ids():
        ep = reader.read(eid)
        g = zarr.open_group(str(Path(src) / f"{eid}.zarr"), mode="w")
        for cam, frames in ep.cameras.items():
            g.create_array(f"images/{cam}", data=np.stack(list(frames)), chunks=(4, 32, 32, 3))
        for k, a in ep.arrays.items():
            g.create_array(k if k != "state" else "obs/state", data=a)
        g.attrs.update({"fps": ep.fps, "prompt": ep.prompt, "split": ep.split})
    return Path(src)


def as_v1(out: Path) -> Path:
    """Rewrite ``out``'s index as format version 1 (every offset in ``index.json``), as older episodepipes did."""
    from episodepipes.format import COLUMNS
    from episodepipes.index import EpisodeIndex
    from episodepipes.sharding.write.writer import write_index

    d = EpisodeIndex.open(out).data
    rest = {k: v for k, v in d.items() if k not in ("format", "version", "options", "shards", "episodes")}
    write_index(Path(out), d["shards"], d["episodes"], d["options"], extra=rest, version=1)
    for file, _, _ in COLUMNS.values():
        (Path(out) / file).unlink(missing_ok=True)
    return Path(out)


def spawn_two_ranks(rank_main, out, *args, deadline: float = 120.0) -> list[dict]:  # noqa: ANN001
    """Run ``rank_main(rank, *args, port, out)`` in 2 spawned processes (a real gloo group on 127.0.0.1) and return
    each rank's ``<out>/rank<r>.json``. A hang fails the test instead of the suite."""
    import json
    import socket

    import pytest
    import torch.multiprocessing as tmp_mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = tmp_mp.spawn(rank_main, args=(*args, port, str(out)), nprocs=2, join=False)
    try:
        if not ctx.join(timeout=deadline) and not ctx.join(timeout=deadline):
            pytest.fail("the 2-rank run did not finish")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
    return [json.loads((Path(out) / f"rank{r}.json").read_text()) for r in (0, 1)]


@contextlib.contextmanager
def gloo_rank(rank: int, port: int, out):  # noqa: ANN001, ANN201
    """In a `spawn_two_ranks` rank: this process as ``rank`` of the 2-process gloo group on 127.0.0.1:``port``.
    Yields the record the rank reports, written to ``<out>/rank<r>.json`` on the way out, then a barrier (so neither
    rank tears the group down while the other still uses it) and the group's teardown."""
    import json
    import os
    from datetime import timedelta

    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=timedelta(seconds=60))
    try:
        record: dict = {}
        yield record
        (Path(out) / f"rank{rank}.json").write_text(json.dumps(record))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def iter_error(pipe) -> str | None:  # noqa: ANN001
    """The ValueError ``iter(pipe)`` raises, as text; None when it starts."""
    try:
        iter(pipe)
    except ValueError as e:
        return str(e)
    return None


def run_script_ranks(script: Path, *args: str, nprocs: int, out: Path, timeout: float,
                     env_extra: dict | None = None) -> list:
    """`run_ranks` over ``python script *args`` (a Lightning DDP app in tests/ddp): the repo and tests/ importable,
    one OpenMP thread per rank, each rank's log in ``<out>/logs``; every rank's exit, none checked."""
    import os
    import sys

    from episodepipes.lightning_glue.launch import run_ranks

    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo), str(repo / "tests")]), "OMP_NUM_THREADS": "1",
           **(env_extra or {})}
    return run_ranks([sys.executable, str(script), *args], nprocs=nprocs, log_dir=Path(out) / "logs",
                     timeout=timeout, env=env, cwd=repo)


def write_mp4(path: Path, frames: list, encoder: str, options: dict) -> None:
    """RGB ``frames`` as a 10 fps mp4 of ``encoder`` (e.g. libx264, libsvtav1) with its ``options``."""
    from fractions import Fraction

    import av

    with av.open(str(path), "w") as out:
        s = out.add_stream(encoder, rate=10, options=options)
        s.width, s.height, s.pix_fmt, s.time_base = frames[0].shape[1], frames[0].shape[0], "yuv420p", Fraction(1, 10)
        for i, a in enumerate(frames):
            f = av.VideoFrame.from_ndarray(a, format="rgb24")
            f.pts = i
            out.mux(s.encode(f))
        out.mux(s.encode())


def decode_rgb(path: Path) -> list:
    """Every frame of ``path``'s first video stream as PyAV decodes it (rgb24): what a copy must give back."""
    import av

    with av.open(str(path)) as c:
        return [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]


def raw_mp4_source(src: Path, synth: SyntheticReader) -> tuple[Path, dict]:
    """A raw source whose cameras ``front`` and ``wrist`` are one h264 and one AV1 mp4 per episode (GOP 4, no
    B-frames), and each frame as PyAV decodes it, keyed ``(episode, step, camera)``."""
    write_raw(src, synth)  # PNG folders, replaced below by the mp4s
    want = {}
    for eid in synth.episode_ids():
        for cam, encoder, options in (("front", "libx264", {"g": "4", "bf": "0"}), ("wrist", "libsvtav1", {"g": "4"})):
            for png in (src / eid / cam).iterdir():
                png.unlink()
            (src / eid / cam).rmdir()
            write_mp4(src / eid / f"{cam}.mp4", list(synth.read(eid).cameras[cam]), encoder, options)
            want.update({(eid, t, cam): f for t, f in enumerate(decode_rgb(src / eid / f"{cam}.mp4"))})
    return src, want


# --- what an attacker puts in place of a regular file (hostile-input tests) ------------------------------------

def put_fifo(p):
    """A FIFO at ``p``: opening it for reading would wait for a writer forever."""
    os.mkfifo(p)


def put_dev_zero(p):
    """A link to /dev/zero at ``p``: a file that never ends."""
    p.symlink_to("/dev/zero")


def put_folder(p):
    """A folder at ``p``."""
    p.mkdir()


def lerobot_in_place(tmp_path: Path, *, lengths: tuple[int, ...] = (40, 30), height: int = 120,
                     width: int = 160) -> tuple[Path, Path]:
    """A LeRobot v3 dataset of two episodes in one mp4 per camera (x264, GOP 4) under ``tmp_path/lr``, indexed in
    place into ``tmp_path/ref`` by the CLI: (the source root, the index folder)."""
    from benchmarks.lerobot_data import make_lerobot
    from episodepipes.sharding.cli import main

    src, out = tmp_path / "lr", tmp_path / "ref"
    make_lerobot(src, lengths=lengths, num_episodes=2, episodes_per_file=2, gop=4, encoder="libx264", height=height,
                 width=width, image_feature=False)
    assert main(["write", str(src), str(out), "--format", "lerobot", "--codec", "reference"]) == 0
    return src, out
