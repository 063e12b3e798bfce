"""What every peer script shares: the frames, the sample order, the measures, one JSON line out.

Each peer runs as ``python benchmarks/peers/peer_<name>.py STAGE DATA OUT [options]`` in its own
interpreter (and, where its dependencies clash with the project's, its own virtualenv), so this
module needs nothing but the standard library, numpy and OpenCV.

DATA (written by `benchmarks.bench_peers`) holds ``frames.npy`` (N, 2, H, W, 3) uint8 RGB,
``state.npy`` (N, 7) float32 and ``meta.json`` (episodes with their first sample and length, fps).
Sample ``i`` is frame ``i - first`` of the episode whose range holds it, in episode order.

Stages: ``convert`` (write the peer's format from the frames, JPEG q90 where the format stores
JPEG), ``train`` (one shuffled epoch, 2 workers, batch 32, both cameras decoded to RGB), ``pinned``
(every frame of one episode, in order), ``resume-save`` / ``resume-load`` (stop after K batches,
save the loader's state, continue in a fresh process, compare with the uninterrupted order).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import cv2
import numpy as np

BATCH = 32
WORKERS = 2
CAMERAS = ("front", "wrist")
QUALITY = 90


def load(data: Path) -> tuple[np.ndarray, np.ndarray, dict]:
    """(frames, state, meta), read fully into memory: conversions do not time the disk read of the source."""
    meta = json.loads((data / "meta.json").read_text())
    return np.load(data / "frames.npy"), np.load(data / "state.npy"), meta


def load_meta(data: Path) -> dict:
    return json.loads((Path(data) / "meta.json").read_text())


def sample_episode(meta: dict) -> np.ndarray:
    """Episode number of every sample."""
    return np.concatenate([np.full(e["length"], k) for k, e in enumerate(meta["episodes"])])


def jpeg(rgb: np.ndarray) -> bytes:
    """JPEG q90 of an RGB frame, encoded as episodepipes' writer encodes it (cv2, BGR input)."""
    ok, buf = cv2.imencode(".jpg", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, QUALITY])
    if not ok:
        raise RuntimeError("JPEG encoding failed")
    return buf.tobytes()


def decode_rgb(data: bytes | np.ndarray) -> np.ndarray:
    """cv2.imdecode to an RGB HxWx3 array: the decoder every JPEG peer uses here, ours included."""
    img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    return cv2.cvtColor(img, cv2.COLOR_BGR2RGB)


class JpegDigest:
    """sha256 over every JPEG written, in sample order and camera order: equal digests mean the same bytes."""

    def __init__(self) -> None:
        self.h = hashlib.sha256()

    def add(self, data: bytes) -> bytes:
        self.h.update(data)
        return data

    def hexdigest(self) -> str:
        return self.h.hexdigest()[:16]


def write_jpegs(frames: np.ndarray, path: Path, digest: JpegDigest) -> np.ndarray:
    """Every frame's cameras as JPEGs concatenated in ``path``; returns their (offset, length) spans."""
    spans = np.zeros((len(frames), len(CAMERAS), 2), np.int64)
    pos = 0
    with open(path, "wb") as f:
        for i in range(len(frames)):
            for k in range(len(CAMERAS)):
                data = digest.add(jpeg(frames[i, k]))
                f.write(data)
                spans[i, k] = (pos, len(data))
                pos += len(data)
    return spans


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def rchar() -> int:
    """Bytes this process has read through read() syscalls so far (page-cache hits included; mmap not)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    return 0


def _files(root: Path) -> list[Path]:
    return [p for p in Path(root).rglob("*") if p.is_file() and p.stat().st_size]


def evict(root: Path) -> None:
    """Drop the page-cache pages of every file under ``root`` (only those files: nothing else on the machine)."""
    for p in _files(root):
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)  # dirty pages are not dropped
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def resident(root: Path) -> int:
    """Bytes of the files under ``root`` now in the page cache (mincore): what a read brought in, by any
    means (read, pread, mmap), kernel readahead included."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    page, total = mmap.PAGESIZE, 0
    for p in _files(root):
        size = p.stat().st_size
        with open(p, "rb") as f:
            m = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)  # private: mapping faults nothing in
            try:
                buf = (ctypes.c_char * size).from_buffer(m)
                vec = (ctypes.c_ubyte * ((size + page - 1) // page))()
                if libc.mincore(ctypes.c_void_p(ctypes.addressof(buf)), ctypes.c_size_t(size), vec):
                    raise OSError(ctypes.get_errno(), f"mincore {p}")
                total += sum(v & 1 for v in vec) * page
                del buf
            finally:
                m.close()
    return total


def versions(*modules: str) -> dict:
    out = {"python": platform.python_version(), "numpy": np.__version__, "opencv": cv2.__version__}
    for m in ("torch", *modules):
        try:
            mod = __import__(m)
            out[m] = getattr(mod, "__version__", "?")
        except ImportError:
            pass
    return out


LAUNCH_ENV = "EPBENCH_LAUNCHED"  # wall-clock time (time.time()) at which the runner started this process


def _stat_cpu(pid: int, tick: float) -> float:
    """CPU seconds of process ``pid`` (all its threads) plus its children it has waited for, from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0  # gone since the listing: its parent has reaped it, and counts it
    return sum(int(fields[k]) for k in (11, 12, 13, 14)) * tick  # utime, stime, cutime, cstime


def descendants(pid: int) -> list[int]:
    """Pids of every live descendant of ``pid`` (children, grandchildren...), read from /proc."""
    parent: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                parent[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out += kids
        todo += kids
    return out


def tree_cpu() -> float:
    """CPU seconds used so far by this process's whole tree: its threads, the children it has reaped, and every
    live descendant (worker processes, a fork server and what it has reaped). Differences of two readings are the
    tree's CPU between them, whichever process did the work."""
    import resource

    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    tick = 1 / os.sysconf("SC_CLK_TCK")
    return (me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
            + sum(_stat_cpu(p, tick) for p in descendants(os.getpid())))


def clock() -> tuple[float, float]:
    """(wall seconds, process-tree CPU seconds) now: what `train_epoch` measures from, taken before the loader is
    built (imports done)."""
    return time.perf_counter(), tree_cpu()


def train_epoch(batches: Iterable, ids_of: Callable[[object], list[int]], ep_of: np.ndarray,
                built: tuple[float, float]) -> dict:
    """Iterate one epoch: time to first batch (from ``built``, a `clock` before the dataset was made; and from the
    launch of
    this process when the runner gave it), frames/s after the first batch, and the process tree's CPU per frame
    after the first batch (``cpu_ms_per_frame``) and over the whole epoch, building included (``epoch_cpu_ms``)."""
    first = None
    ids: list[int] = []
    distinct = []
    t_first_batch = fresh = 0.0
    t_build, c_build = built
    for b in batches:
        batch_ids = ids_of(b)
        if first is None:
            first, c_first = time.perf_counter(), tree_cpu()
            fresh = time.time() - float(os.environ.get(LAUNCH_ENV, "nan"))
            t_first_batch = first - t_build
            n_first = len(batch_ids)
        ids += batch_ids
        distinct.append(len(set(ep_of[batch_ids].tolist())))
    t_end, c_end = time.perf_counter(), tree_cpu()
    if first is None:
        raise RuntimeError("the loader yielded no batch")
    rest = len(ids) - n_first
    return {"first_batch_s": t_first_batch, "first_batch_fresh_s": fresh if fresh == fresh else None,
            "frames": len(ids), "unique_frames": len(set(ids)),
            "fps": rest / (t_end - first) if rest and t_end > first else None,
            "cpu_ms_per_frame": 1000 * (c_end - c_first) / rest if rest else None,
            "epoch_cpu_ms": 1000 * (c_end - c_build) / len(ids),
            "distinct_episodes_per_batch": float(np.mean(distinct)) if distinct else None,
            "batches": len(distinct), "head": ids[:64]}


def resume_check(reference: list[int], resumed: list[int], k_seen: int) -> dict:
    rest = reference[k_seen:]
    return {"exact": resumed == rest, "same_set": sorted(resumed) == sorted(rest), "expected": len(rest),
            "got": len(resumed)}


def main(stages: dict[str, Callable[[argparse.Namespace], dict]]) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("stage", choices=sorted(stages))
    ap.add_argument("data", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--episode", type=int, default=0, help="pinned: which episode")
    ap.add_argument("--stop-after", type=int, default=3, help="resume: batches before the state is saved")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--method", default="thread", help="episodepipes only: train_pipe's method")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.stage == "convert":
        shutil.rmtree(args.out, ignore_errors=True)
    if args.stage == "pinned":
        evict(args.out)  # a cold read of the dataset's files: what the episode costs from disk
    t0 = time.perf_counter()
    res = stages[args.stage](args)
    if args.stage == "pinned":
        res["disk_bytes"] = resident(args.out)
    res["stage_s"] = time.perf_counter() - t0
    sys.stdout.write("EPBENCH " + json.dumps(res) + "\n")
    sys.stdout.flush()


def tensors(s: dict) -> dict:
    """A stored sample (idx, state, one JPEG per camera) as the torch tensors every streaming peer yields."""
    import torch  # only the peers that yield tensors have it

    return {"idx": int(s["idx"]), "state": torch.from_numpy(np.array(s["state"])),
            **{c: torch.from_numpy(decode_rgb(s[c])).permute(2, 0, 1) for c in CAMERAS}}


def idx_of(b: dict) -> list[int]:
    """Sample numbers of a batch whose ``idx`` column is a tensor."""
    return b["idx"].tolist()


def resume_save(loader, ids_of: Callable[[object], list[int]], a: argparse.Namespace, name: str,  # noqa: ANN001
                dumps: Callable[[object], bytes] = lambda s: json.dumps(s).encode()) -> dict:
    """Take ``a.stop_after`` batches, save the loader's state as ``<name>.state``, then finish the epoch and keep
    its whole order as ``<name>.reference``: what `resume_load` is compared with."""
    seen: list[int] = []
    it = iter(loader)
    for _ in range(a.stop_after):
        seen += ids_of(next(it))
    (a.out.parent / f"{name}.state").write_bytes(dumps(loader.state_dict()))
    for b in it:
        seen += ids_of(b)
    (a.out.parent / f"{name}.reference").write_text(",".join(map(str, seen)))
    return {"saved_after": a.stop_after}


def resume_load(loader, ids_of: Callable[[object], list[int]], a: argparse.Namespace, name: str,  # noqa: ANN001
                loads: Callable[[bytes], object] = json.loads) -> dict:
    """Restore the state `resume_save` wrote into a fresh loader; compare the rest of its epoch with the reference."""
    loader.load_state_dict(loads((a.out.parent / f"{name}.state").read_bytes()))
    got = [i for b in loader for i in ids_of(b)]
    ref = [int(x) for x in (a.out.parent / f"{name}.reference").read_text().split(",")]
    return resume_check(ref, got, a.stop_after * BATCH)
