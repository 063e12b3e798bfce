"""The peer libraries side by side on the same frames: conversion, bytes, first batch, train, one episode, resume.

Frames: real footage (`benchmarks.footage`: Debian's vtest.avi, Megamind.avi, cockatoo.mp4), 224x224.
Peers: Grain 0.2 (the same JPEG bytes in ArrayRecord files; ``MapDataset.shuffle().map(cv2 decode)`` on its thread
pool, ``ReadOptions(num_threads=2)``, and with ``mp_prefetch`` over 2 processes), MosaicML Streaming
(``MDSWriter`` + ``StreamingDataset``/``StreamingDataLoader``), LitData
(``optimize`` + ``StreamingDataset``/``StreamingDataLoader``), WebDataset (``ShardWriter``, then
``WebDataset(shardshuffle).shuffle(1000)`` + cv2 decode + ``DataLoader``) and LeRobotDataset v3 (its
own writer, ``LeRobotDataset.create`` + ``add_frame`` + ``save_episode``, read with its PyAV backend) and DALI 2.4's
CPU pipeline (the same JPEG bytes in one flat file, ``fn.external_source`` batches into ``fn.decoders.image(device=
"cpu")`` on 2 threads, ``device_id=None``: no GPU; it decodes with its own libjpeg-turbo path, not cv2).
Every JPEG peer stores the same JPEG q90 bytes as ours (cv2-encoded from the same RGB frames; the
digest column checks it) and decodes them with ``cv2.imdecode`` (ours: libjpeg-turbo directly, simplejpeg, which
gives OpenCV's pixels); LeRobot stores AV1 video (libsvtav1,
its writer's default), as its format requires. Shards or chunks target 8 MB everywhere.

Each stage runs in a fresh process: ``convert`` (from frames already in memory, JPEG encoding
included; ours and LitData with 2 worker processes, the others single-process as their writers
are), ``train`` (one shuffled epoch, batch 32, 2 DataLoader workers / 2 decode threads for ours;
throughput is frames/s after the first batch), ``pinned`` (every frame of one episode, in order, decoded; bytes
are what the process read through ``read()``, from ``/proc/self/io`` rchar), and resume (stop after 3 batches,
save the loader's state, restore it in a new process, compare the rest with the uninterrupted order of the same
seed). Beside the loaders, the decode ceiling runs as two more rows of every rep: the same JPEG bytes, read into
memory first, decoded bare by ``simplejpeg.decode_jpeg`` and by ``cv2.imdecode`` on 2 threads
(`benchmarks/peers/peer_bare.py`). CPU per frame is the CPU of the loader's whole process tree (its threads,
its worker processes, a fork server and what that reaped; `common.tree_cpu`) after the first batch, per frame
after it; "whole epoch" counts from building the dataset to the end over every frame. First batch is timed
twice: from the launch of the fresh process (interpreter start and imports included: what a user waits for) and
from building the dataset (imports done). ``EPBENCH_PEERS=grain,dali`` runs some peers only (keys: ours,
ours-process, simplejpeg, cv2, grain, grain-process, dali, mosaic, litdata, wds, lerobot; ours and the bare
decoders always run); ``EPBENCH_PEER_REPS`` sets the train reps (4).

MosaicML Streaming and LitData need torchvision, and PyPI's torchvision does not import beside
the CPU torch this project pins, so they run in a virtualenv this benchmark creates (torch 2.14.1 +
torchvision 0.29.1; Mosaic also caps numpy below 2.2). LeRobot 0.4.4 installs on Python 3.11 but
requires torch below 2.11 and torchvision below 0.26, which the project's torch 2.13 cannot satisfy, so
it runs in a second one (torch 2.9.1 + torchvision 0.24.1). Its dataset is local: nothing is fetched
from a hub (``HF_HUB_OFFLINE=1``). See `benchmarks/peers/venvs.py`; versions are listed under the tables.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.peers import common, venvs

PEERS_DIR = Path(__file__).resolve().parent / "peers"


@dataclass(frozen=True)
class Peer:
    """One row: the script that runs it, its virtualenv (None: this interpreter), its ``EPBENCH_PEERS`` name, the
    options its train stage takes, and the row whose converted data it reads (None: its own)."""

    script: str
    venv: str | None
    key: str
    args: tuple[str, ...] = ()
    same_as: str | None = None


PEERS = {
    "episodepipes": Peer("peer_ours.py", None, "ours"),
    "episodepipes, method='process'": Peer("peer_ours.py", None, "ours-process", ("--method", "process"),
                                           "episodepipes"),
    "bare simplejpeg, 2 threads": Peer("peer_bare.py", None, "simplejpeg", ("--method", "simplejpeg")),
    "bare cv2.imdecode, 2 threads": Peer("peer_bare.py", None, "cv2", ("--method", "cv2"),
                                         "bare simplejpeg, 2 threads"),
    "Grain, thread pool": Peer("peer_grain.py", "grain", "grain"),
    "Grain, processes": Peer("peer_grain.py", "grain", "grain-process", ("--method", "process"), "Grain, thread pool"),
    "DALI, CPU pipeline": Peer("peer_dali.py", "dali", "dali"),
    "MosaicML Streaming": Peer("peer_mosaic.py", "stream", "mosaic"),
    "LitData": Peer("peer_litdata.py", "stream", "litdata"),
    "WebDataset": Peer("peer_wds.py", None, "wds"),
    "LeRobotDataset v3": Peer("peer_lerobot.py", "lerobot", "lerobot"),
}
ALWAYS = ("episodepipes", "episodepipes, method='process'", "bare simplejpeg, 2 threads",
          "bare cv2.imdecode, 2 threads")  # what every ratio is taken against
BARE = ("bare simplejpeg, 2 threads", "bare cv2.imdecode, 2 threads")


def chosen(env: str | None = None) -> list[str]:
    """The rows to run: ``EPBENCH_PEERS`` (comma-separated keys, e.g. ``grain,dali``) plus ours and the bare
    decoders, in `PEERS` order; every row when it is unset or empty."""
    env = os.environ.get("EPBENCH_PEERS", "") if env is None else env
    keys = {k.strip() for k in env.split(",") if k.strip()}
    known = {p.key for p in PEERS.values()}
    if keys - known:
        raise SystemExit(f"EPBENCH_PEERS: unknown {', '.join(sorted(keys - known))}; choose among "
                         f"{', '.join(sorted(known))}")
    return [n for n, p in PEERS.items() if not keys or n in ALWAYS or p.key in keys]


def make_frames(data: Path, *, episodes: int, length: int, size: int = 224) -> dict:
    """DATA for the peer scripts: frames.npy (N, 2, H, W, 3) RGB of the footage episodes (`benchmarks.footage`: the
    frames our writer shards in the train section), state.npy, meta.json."""
    from benchmarks.footage import FootageReader, clip_paths

    data.mkdir(parents=True, exist_ok=True)
    if (data / "meta.json").exists():
        return json.loads((data / "meta.json").read_text())
    reader = FootageReader(clip_paths(), episodes=episodes, length=length, size=(size, size))
    n = episodes * length
    frames = np.lib.format.open_memmap(data / "frames.npy", mode="w+", dtype=np.uint8, shape=(n, 2, size, size, 3))
    state = np.zeros((n, 7), np.float32)
    eps, first = [], 0
    for eid in reader.episode_ids():
        ep = reader.read(eid)
        for k, cam in enumerate(("front", "wrist")):
            frames[first:first + length, k] = np.stack([f[..., ::-1] for f in ep.cameras[cam]])  # BGR -> RGB
        state[first:first + length] = np.asarray(ep.arrays["state"], np.float32)[:, :7]
        eps.append({"id": eid, "first": first, "length": length})
        first += length
    frames.flush()
    del frames
    np.save(data / "state.npy", state)
    meta = {"episodes": eps, "fps": float(reader.read(reader.episode_ids()[0]).fps), "size": size}
    (data / "meta.json").write_text(json.dumps(meta))
    return meta


def _call(peer: str, stage: str, data: Path, out: Path, *extra: str, log: Path, timeout: float = 1200) -> dict:
    """Run one stage of one peer in a fresh process; its JSON result, or {"error": ...}."""
    p = PEERS[peer]
    try:
        py = sys.executable if p.venv is None else str(venvs.ensure(p.venv, log=log))
    except (RuntimeError, OSError, subprocess.CalledProcessError) as e:
        return {"error": f"could not install: {e}"}
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
    env[common.LAUNCH_ENV] = repr(time.time())  # the peer's first batch is also timed from here: a fresh process
    try:
        r = subprocess.run([py, str(PEERS_DIR / p.script), stage, str(data), str(out), *extra], capture_output=True,
                           text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"{stage} timed out after {timeout:.0f} s"}
    with open(log, "a") as f:
        f.write(f"== {peer} {stage} rc={r.returncode}\n{r.stderr[-4000:]}\n")
    for line in r.stdout.splitlines():
        if line.startswith("EPBENCH "):
            return json.loads(line[8:])
    tail = (r.stderr.strip().splitlines() or ["no output"])[-1]
    return {"error": f"{stage} exited {r.returncode}: {tail[:300]}"}


def _span(xs: list[float], fmt: str = "{:,.0f}") -> str:
    xs = [x for x in xs if x is not None]
    if not xs:
        return "–"
    m = fmt.format(statistics.median(xs))
    return m if len(xs) == 1 else f"{m} ({fmt.format(min(xs))}-{fmt.format(max(xs))})"


def run(workdir: Path, quick: bool) -> dict:
    eps, length = (12, 50) if quick else (24, 150)
    reps = 2 if quick else int(os.environ.get("EPBENCH_PEER_REPS", "4"))
    names = chosen()
    data = workdir / "data"
    meta = make_frames(data, episodes=eps, length=length)
    n = eps * length
    log = workdir / "peers.log"
    pinned_ep = eps // 2
    res: dict[str, dict] = {p: {"convert": [], "train": [], "pinned": []} for p in names}
    for peer in names:
        if PEERS[peer].same_as:
            continue
        out = workdir / peer.split()[0].lower().strip(",")
        c = _call(peer, "convert", data, out, log=log)  # once: LeRobot's video encoding alone takes minutes
        if "error" in c:
            res[peer]["error"] = c["error"]
        else:
            res[peer]["convert"].append(c)
        res[peer]["out"] = out
        print(f"    peers: {peer} converted: {res[peer].get('error') or 'ok'}", flush=True)
    for peer in names:
        if (of := PEERS[peer].same_as):
            res[peer].update({k: v for k, v in res[of].items() if k in ("error", "out")}, same_as=of)
    live = [p for p in names if "error" not in res[p]]
    for rep in range(reps):  # paired: every row back to back, each in a fresh process, the order rotated each rep
        for peer in live[rep % len(live):] + live[:rep % len(live)]:
            t = _call(peer, "train", data, res[peer]["out"], *PEERS[peer].args, log=log)
            res[peer]["train"].append(t if "error" not in t else {})  # an empty rep keeps the pairing by position
            if "error" in t:
                res[peer]["train_error"] = t["error"]
        print(f"    peers: train rep {rep + 1}/{reps} done", flush=True)
    loaders = [p for p in live if not PEERS[p].same_as and p not in BARE]
    for _ in range(1 if quick else 3):
        for peer in loaders:
            pn = _call(peer, "pinned", data, res[peer]["out"], "--episode", str(pinned_ep), log=log)
            if "error" in pn:
                res[peer]["pinned_error"] = pn["error"]
            else:
                res[peer]["pinned"].append(pn)
    for peer in loaders:
        if PEERS[peer].script in ("peer_ours.py", "peer_mosaic.py", "peer_litdata.py"):
            s = _call(peer, "resume-save", data, res[peer]["out"], log=log)
            r = _call(peer, "resume-load", data, res[peer]["out"], log=log) if "error" not in s else s
            res[peer]["resume"] = ("yes, exact" if r.get("exact") else "same frames, other order" if r.get("same_set")
                                   else f"no ({r.get('error') or str(r.get('got')) + ' of ' + str(r.get('expected'))})")
        else:
            res[peer]["resume"] = {"peer_wds.py": "no: a tar stream with a shuffle buffer has no state to save",
                                   "peer_lerobot.py": "no: a torch DataLoader + RandomSampler keep no position",
                                   "peer_grain.py": "not measured here (Grain iterators have get_state/set_state)",
                                   "peer_dali.py": "no: the sample order is fed by external_source; DALI keeps none"}[
                                       PEERS[peer].script]
    print(f"    peers: done ({', '.join(live)})", flush=True)
    return _report(res, meta, names=names, n=n, eps=eps, length=length, reps=reps, pinned_ep=pinned_ep)


def _per_rep(res: dict, peer: str, key: str) -> list[float | None]:
    """``key`` of each train rep of ``peer``, by rep (None where the rep failed): pairs line up by position."""
    return [t.get(key) for t in res[peer]["train"]]


def _ratios(a: list[float | None], b: list[float | None]) -> list[float]:
    return [x / y for x, y in zip(a, b) if x and y]


def _train_table(res: dict, names: list[str]) -> list[list[str]]:
    """One row per loader and bare decoder: frames/s, its ratios to the ceilings and ours, CPU, first batch."""
    fps = {p: _per_rep(res, p, "fps") for p in names if "error" not in res[p]}
    ceil, ceil_cv2 = fps.get(BARE[0], []), fps.get(BARE[1], [])
    ours, ours_p = fps.get("episodepipes", []), fps.get("episodepipes, method='process'", [])
    rows = []
    for p in sorted(fps, key=lambda p: -statistics.median([x for x in fps[p] if x] or [0])):
        bare = p in BARE
        rows.append([f"**{p}**" if p.startswith("episodepipes") else p, _span(fps[p]),
                     _span(_ratios(fps[p], ceil), "{:.2f}"), _span(_ratios(fps[p], ceil_cv2), "{:.2f}"),
                     _span(_ratios(ours, fps[p]), "{:.2f}x"), _span(_ratios(ours_p, fps[p]), "{:.2f}x"),
                     _span(_per_rep(res, p, "cpu_ms_per_frame"), "{:.2f}"),
                     _span(_per_rep(res, p, "epoch_cpu_ms"), "{:.2f}"),
                     _span(_per_rep(res, p, "first_batch_fresh_s"), "{:.2f}"),
                     "–" if bare else _span(_per_rep(res, p, "first_batch_s"), "{:.2f}")])
    return rows


def _report(res: dict, meta: dict, *, names: list[str], n: int, eps: int, length: int, reps: int,
            pinned_ep: int) -> dict:
    loaders = [p for p in names if p not in BARE]
    ours = res["episodepipes"]

    def col(peer: str, fn, train: bool) -> str:  # noqa: ANN001
        r = res[peer]
        if "error" in r:
            return "not run"
        if "same_as" in r and not train:
            return f"as {r['same_as']}"
        try:
            return fn(r)
        except (KeyError, TypeError, ValueError, statistics.StatisticsError):
            return r.get("train_error") or r.get("pinned_error") or "–"

    uniform = eps * (1 - (1 - 1 / eps) ** 32)
    ourdig = (ours["convert"] or [{}])[0].get("jpeg_digest")
    rows = [
        ["conversion (s)", lambda r: _span([c["convert_s"] for c in r["convert"]], "{:.2f}")],
        ["how it converts", lambda r: r["convert"][0]["how"]],
        ["bytes on disk (MB)", lambda r: f"{r['convert'][0]['bytes'] / 1e6:.1f}"],
        ["same JPEG bytes as ours", lambda r: ("video, not JPEG" if r["convert"][0]["jpeg_digest"] is None else
                                               "yes" if r["convert"][0]["jpeg_digest"] == ourdig else "no")],
        ["frames per epoch", lambda r: _span([t.get("frames") for t in r["train"]])],
        ["distinct episodes per batch of 32", lambda r: _span([t.get("distinct_episodes_per_batch")
                                                                for t in r["train"]], "{:.1f}")],
        [f"one pinned episode ({length} frames), s", lambda r: _span([p["seconds"] for p in r["pinned"]], "{:.3f}")],
        ["... from disk, MB (page cache dropped first)", lambda r: _span([p["disk_bytes"] / 1e6 for p in r["pinned"]],
                                                                         "{:.2f}")],
        ["... through read(), MB (rchar)", lambda r: _span([p["rchar"] / 1e6 for p in r["pinned"]], "{:.2f}")],
        ["... how", lambda r: r["pinned"][0]["how"]],
        ["resumes mid-epoch exactly", lambda r: r["resume"]],
    ]
    train_rows = ("frames per epoch", "distinct episodes per batch of 32")
    table = [[label, *(col(p, fn, label in train_rows) for p in loaders)] for label, fn in rows]
    versions = {p: ", ".join(f"{k} {v}" for k, v in res[p]["convert"][0]["versions"].items())
                for p in names if res[p].get("convert")}
    errors = {p: res[p].get("error") or res[p].get("train_error") for p in names
              if res[p].get("error") or res[p].get("train_error")}
    intro = (__doc__.split("\n\n", 1)[1].strip() +
             f"\n\n{n} frames ({eps} episodes x {length}) of 2 cameras 224x224 plus a 7-float state; {reps} train "
             "reps, every row once per rep, each in a fresh process, in an order rotated each rep; ratios are per rep; "
             f"median (range). A uniform shuffle would put about {uniform:.1f} distinct episodes in a batch of 32; "
             f"the pinned episode is number {pinned_ep}.")
    if errors:
        intro += "\n\nNot run: " + "; ".join(f"{p}: {e}" for p, e in errors.items())
    return {"section": "peers", "intro": intro, "rows": [],
            "tables": [{"title": "Shuffled train, 224x224, batch 32, 2 threads / workers: median (range) over the reps",
                        "columns": ["loader", "frames/s", "x bare simplejpeg", "x bare cv2", "ours (threads) / it",
                                    "ours (processes) / it", "CPU ms/frame", "CPU ms/frame, whole epoch",
                                    "first batch, fresh process (s)", "first batch from building (s)"],
                        "rows": _train_table(res, names)},
                       {"title": "Each library on the same frames", "columns": ["", *loaders], "rows": table}],
            "versions": versions,
            "series": {p: {k: v for k, v in r.items() if k != "out"} for p, r in res.items()}}


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        print(json.dumps(run(Path(tmp), "--quick" in sys.argv), indent=1, default=str)[:20000])
        print(f"{time.perf_counter() - t0:.0f} s", file=sys.stderr)
        shutil.rmtree(tmp, ignore_errors=True)
