"""Virtualenvs the peers section creates for peers that cannot live beside the project's torch.

MosaicML Streaming caps numpy below 2.2 and, like LitData, requires torchvision; PyPI's torchvision
does not import beside the CPU torch 2.13 build this project pins, so those peers get a venv with a
torch/torchvision pair that works together. LeRobot 0.4 caps torch below 2.11 and torchvision below
0.26, so it gets its own. Grain gets one of its own (it needs no torch), and so does DALI (its CPU
pipeline; the CUDA 12 wheel brings ~1 GB of CUDA image libraries). Each venv is made once, under
``EPBENCH_VENVS`` (default ``~/.cache/episodepipes-bench``), and re-made when its requirement list changes.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

# name -> pip install steps, in order (each step one `pip install` call)
SPECS: dict[str, list[list[str]]] = {
    "stream": [["torch==2.14.1", "torchvision==0.29.1"],
               ["mosaicml-streaming==0.13.0", "litdata==0.2.76", "opencv-python-headless", "webdataset"]],
    "lerobot": [["torch==2.9.1", "torchvision==0.24.1"],
                ["lerobot==0.4.4"]],
    # Grain brings no torch: it reads the same JPEG bytes from ArrayRecord files of its own and decodes them itself
    "grain": [["grain==0.2.18", "opencv-python-headless", "simplejpeg"]],
    # DALI's wheel is built for CUDA 12 but its CPU pipelines run without a GPU; no torch either
    "dali": [["nvidia-dali-cuda120==2.4.0", "opencv-python-headless"]],
}


def root() -> Path:
    return Path(os.environ.get("EPBENCH_VENVS", Path.home() / ".cache" / "episodepipes-bench"))


def _digest(steps: list[list[str]]) -> str:
    return hashlib.sha256(json.dumps(steps).encode()).hexdigest()[:12]


def python(name: str) -> Path:
    return root() / name / "bin" / "python"


def build_seconds(name: str) -> float | None:
    """How long the venv's build took (from its creation to its stamp), or None where it is not built."""
    venv = root() / name
    try:
        return (venv / ".epbench-installed").stat().st_mtime - (venv / "pyvenv.cfg").stat().st_mtime
    except OSError:
        return None


def ensure(name: str, *, log: Path | None = None) -> Path:
    """The venv's python, creating the venv first if it is missing or stale; raises with pip's last lines.

    Builds hold an exclusive lock on ``<root>/.build.lock``: two benchmark runs started together build a venv once,
    and neither uses one the other is half-way through building."""
    steps = SPECS[name]
    venv, stamp = root() / name, root() / name / ".epbench-installed"
    if stamp.exists() and stamp.read_text() == _digest(steps):
        return python(name)
    root().mkdir(parents=True, exist_ok=True)
    with open(root() / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if stamp.exists() and stamp.read_text() == _digest(steps):  # built by whoever held the lock before us
            return python(name)
        return _build(name, steps, venv, stamp, log)


def _build(name: str, steps: list[list[str]], venv: Path, stamp: Path, log: Path | None) -> Path:
    print(f"    creating the {name!r} virtualenv under {venv} (once; several GB)", flush=True)
    shutil.rmtree(venv, ignore_errors=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    py311 = shutil.which("python3.11") or sys.executable
    out = open(log, "a") if log else subprocess.DEVNULL  # noqa: SIM115
    try:
        subprocess.run([py311, "-m", "venv", str(venv)], check=True, stdout=out, stderr=out)
        for step in [["--upgrade", "pip"], *steps]:
            r = subprocess.run([str(python(name)), "-m", "pip", "install", "-q", *step], stdout=out,
                               stderr=subprocess.PIPE, text=True)
            if r.returncode:
                last = " | ".join(r.stderr.strip().splitlines()[-3:])
                raise RuntimeError(f"venv {name!r}: pip install {' '.join(step)} failed: {last}")
    finally:
        if log:
            out.close()  # type: ignore[union-attr]
    stamp.write_text(_digest(steps))
    return python(name)


if __name__ == "__main__":
    for n in sys.argv[1:] or list(SPECS):
        print(n, ensure(n))
