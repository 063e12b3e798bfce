"""What the read lease on local shards costs a training pass: leased against bare mappings, in the same run.

Two server processes, identical but for ``EPISODEPIPES_UNSAFE_BARE_MAPPINGS=1`` in the bare one's environment (read
once by `episodepipes.pipes._decode.leases`: no lease, no watcher thread), each build a thread `train_pipe` (and the
window pipe of the train section) on the train section's 224x224 footage and run one warm epoch. Then `PAIRS` pairs:
one epoch in each process, one after the other (which goes first alternates; half the pairs with the servers started
again in the other order), and the ratio leased / bare of frames
per wall second and per CPU second of that process (all its threads). The rows give the median ratio and its range.

The pieces, measured directly in the same processes: the per-shard cost of taking a shard up (a reader's first frame
of each shard, then its mapping let go), leased minus bare in microseconds of CPU, times the shards a pass takes up,
over the pass's CPU; and how often the lease watcher woke during the passes (``leases.wakeups``).

``python -m benchmarks.bench_lease [WORKDIR] [--quick] [--control]`` runs this alone; ``--control`` leases on both
sides, which shows the spread of the method itself where the true ratio is 1.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAIRS = 12  # pairs of passes per pipe (the ratio's median and range)
OPENS = 20  # rounds of taking up every shard, per side (`_opens`)


def _cpu() -> float:
    me = resource.getrusage(resource.RUSAGE_SELF)
    return me.ru_utime + me.ru_stime


def _pass(pipe: object) -> dict:
    from episodepipes.pipes._decode import leases

    n, w0 = 0, leases.wakeups()
    t0, c0 = time.perf_counter(), _cpu()
    for b in pipe:  # type: ignore[attr-defined]
        n += len(b["episode"])
    return {"frames": n, "wall": time.perf_counter() - t0, "cpu": _cpu() - c0, "wakeups": leases.wakeups() - w0}


def _opens(root: str, rounds: int) -> dict:
    """Seconds (wall, CPU) per shard of a reader's first frame of each shard, the reader then dropped (its mappings
    go): what a pass pays per shard besides its frames."""
    from episodepipes.index import EpisodeIndex
    from episodepipes.pipes._decode.mapped import ShardFrames
    from episodepipes.shardio import LocalSource

    names = [s.name for s in EpisodeIndex.open(root).shards]
    src = LocalSource(root)
    for name in names:  # the source's own descriptors, opened once (as in a pass): not part of what is compared
        src.fileno(name)
    t0, c0 = time.perf_counter(), _cpu()
    for _ in range(rounds):
        reader = ShardFrames(src)
        for name in names:
            reader.frame(name, 0, 512)
        del reader
    n = rounds * len(names)
    src.close()
    return {"wall": (time.perf_counter() - t0) / n, "cpu": (_cpu() - c0) / n, "shards": len(names)}


def serve(root: str) -> None:
    """A server process: builds the pipes, then answers one JSON line per command line on stdin."""
    from benchmarks.bench_train import BATCH, WINDOW
    from episodepipes.pipes.train import train_pipe

    def build(**kw: object) -> object:
        return train_pipe(root, batch_size=BATCH, seed=0, rank=0, world_size=1, num_workers=2, method="thread", **kw)

    pipes = {"thread": build(), "window": build(**WINDOW)}
    for p in pipes.values():  # warm, as the train section's pipes
        _pass(p)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        out = _pass(pipes[cmd["pass"]]) if "pass" in cmd else _opens(root, cmd["opens"])
        print(json.dumps(out), flush=True)
    for p in pipes.values():
        p.shutdown()  # type: ignore[attr-defined]


class _Server:
    def __init__(self, root: Path, *, bare: bool) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        env.pop("EPISODEPIPES_UNSAFE_BARE_MAPPINGS", None)
        if bare:
            env["EPISODEPIPES_UNSAFE_BARE_MAPPINGS"] = "1"
        self.proc = subprocess.Popen([sys.executable, "-m", "benchmarks.bench_lease", "--serve", str(root)], env=env,
                                     cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.ask(None)

    def ask(self, cmd: dict | None) -> dict:
        if cmd is not None:
            self.proc.stdin.write(json.dumps(cmd) + "\n")  # type: ignore[union-attr]
            self.proc.stdin.flush()  # type: ignore[union-attr]
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        if not line:
            raise RuntimeError(f"the lease benchmark's server exited ({self.proc.wait()})")
        return json.loads(line)

    def close(self) -> None:
        self.proc.stdin.close()  # type: ignore[union-attr]
        self.proc.wait(60)


def _span(values: list[float], fmt: str = "{:.3f}") -> str:
    v = sorted(values)
    return f"{fmt.format(v[len(v) // 2])} (range {fmt.format(v[0])}-{fmt.format(v[-1])} over {len(v)})"


def _mid(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def measure(root: Path, pairs: int, kinds: tuple[str, ...] = ("thread", "window"), *, control: bool = False) -> dict:
    """``pairs`` alternated pairs of passes per pipe kind, then `OPENS` rounds of shard take-ups per side;
    ``control``: both sides leased (the method's own spread, where the true ratio is 1)."""
    runs: dict[str, dict[str, list[dict]]] = {k: {"leased": [], "bare": []} for k in kinds}
    opens: dict[str, list[dict]] = {"leased": [], "bare": []}
    for half in range(2):  # the servers started again, the other one first: which process is which has shown bias
        first = ("leased", "bare") if half == 0 else ("bare", "leased")
        sides = {side: _Server(root, bare=side == "bare" and not control) for side in first}
        try:
            for i in range(pairs // 2):
                order = first if i % 2 == 0 else first[::-1]
                for k in kinds:
                    for side in order:
                        runs[k][side].append(sides[side].ask({"pass": k}))
            for i in range(2):
                for side in first if i % 2 == 0 else first[::-1]:
                    opens[side].append(sides[side].ask({"opens": OPENS // 4}))
        finally:
            for s in sides.values():
                s.close()
    return {"runs": runs, "opens": opens}


def rows(got: dict) -> list[dict]:
    out = []
    per_shard = {s: _mid([o["cpu"] for o in got["opens"][s]]) for s in ("leased", "bare")}
    walls = {s: _mid([o["wall"] for o in got["opens"][s]]) for s in ("leased", "bare")}
    shards = got["opens"]["leased"][0]["shards"]
    for k, sides in got["runs"].items():
        lease, bare = sides["leased"], sides["bare"]
        wall = [(a["frames"] / a["wall"]) / (b["frames"] / b["wall"]) for a, b in zip(lease, bare)]
        cpu = [(a["frames"] / a["cpu"]) / (b["frames"] / b["cpu"]) for a, b in zip(lease, bare)]
        pass_cpu = _mid([b["cpu"] for b in bare])
        share = shards * (per_shard["leased"] - per_shard["bare"]) / pass_cpu
        wakes = [a["wakeups"] for a in lease]
        secs = sum(a["wall"] for a in lease)
        out.append({
            "metric": f"224x224 footage, {'threads' if k == 'thread' else 'windows'}: leased vs bare mappings",
            "ours": _mid([a["frames"] / a["wall"] for a in lease]), "baseline": _mid([b["frames"] / b["wall"]
                                                                                      for b in bare]),
            "ceiling": None, "unit": "frames/s",
            "note": f"leased / bare per pair, frames per wall second {_span(wall)}, per CPU second {_span(cpu)} "
                    f"(issue 23's bar: >= 0.98); {shards} shards a pass: taking a shard up costs "
                    f"{per_shard['leased'] * 1e6:.0f} us of CPU leased, {per_shard['bare'] * 1e6:.0f} us bare "
                    f"(wall {walls['leased'] * 1e6:.0f} / {walls['bare'] * 1e6:.0f} us), "
                    f"{share:.2%} of a pass's CPU ({pass_cpu:.2f} s bare); the lease watcher woke {sum(wakes)} "
                    f"times in {secs:.0f} s of leased passes; two server processes, identical but for "
                    "EPISODEPIPES_UNSAFE_BARE_MAPPINGS=1 in the bare one's environment, alternating who goes first"})
    return out


def run(workdir: Path, quick: bool, *, control: bool = False) -> dict:
    """The train section's rows of the lease's cost (its 224x224 footage, made here if the section has not)."""
    from benchmarks.footage import shard_footage

    eps, length = (8, 60) if quick else (24, 150)
    idx = shard_footage(workdir / "footage-224", episodes=eps, length=length, size=(224, 224))
    return {"section": "lease", "intro": __doc__.split("\n\n", 1)[1].strip(),
            "rows": rows(measure(idx.root, 4 if quick else PAIRS, control=control))}


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        serve(sys.argv[2])
    else:
        import tempfile

        args = [a for a in sys.argv[1:] if not a.startswith("--")]
        work = Path(args[0]) if args else Path(tempfile.mkdtemp(prefix="bench-lease-"))
        print(json.dumps(run(work, "--quick" in sys.argv, control="--control" in sys.argv), indent=1))
