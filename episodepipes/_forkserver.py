"""Worker processes that start from a clean state, shared by the decode pools and the shard writer's encoders.

Why not ``fork``: a child forked from a process with threads gets every lock as it was at the fork, and a lock another
thread held then (OpenCV's inside ``cv2.split`` in a decode thread of another pipe, libav's in an encoder, a user's
``threading.Lock``) stays held forever in the child, which then blocks on it: a process pass after a thread pass hung
that way, and so did writes whose encoder pool forked beside the writer's threads. multiprocessing's fork server is a
fresh interpreter, started once per process, with the library (and torch, cv2, lightning, av if loaded here) imported
before it forks anything, so workers start from that clean state in milliseconds. They inherit nothing of the caller:
shared memory is given to them as descriptors (`multiprocessing.reduction.DupFd`), and the main module is imported in
each worker as `multiprocessing` does for spawned children (keep a script's work under ``if __name__ == "__main__":``).
"""

from __future__ import annotations

import ctypes
import gc
import multiprocessing as mp
import os
import signal
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from episodepipes._deathsig import die_with, exit_with

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt(3)
_MMAP_THRESHOLD = 64 << 20
PRELOAD_IF_LOADED = ("torch", "cv2", "lightning", "av")  # imported by the fork server when this process has them
_preloaded = False


def start_method() -> str:
    """``"forkserver"`` where the platform has it, else ``"spawn"`` (both start workers from a clean state)."""
    return "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"


def context(preload: Sequence[str]) -> mp.context.BaseContext:
    """The start context. The first call's ``preload`` modules are what the fork server imports before it forks
    anything (it starts once per process); a later caller's modules are imported by each of its workers."""
    global _preloaded
    method = start_method()
    ctx = mp.get_context(method)
    if method == "forkserver" and not _preloaded:
        ctx.set_forkserver_preload([*preload, *(m for m in PRELOAD_IF_LOADED if m in sys.modules)])
        _preloaded = True
    return ctx


def start(preload: Sequence[str]) -> None:
    """Start the fork server now (a fresh interpreter importing ``preload``), so that it gets ready while the caller
    does other work, not while its first pool waits; nothing where there is no fork server or it runs already."""
    context(preload)
    if start_method() == "forkserver":
        from multiprocessing import forkserver

        forkserver.ensure_running()


def listed(procs: Iterable[tuple[int, Any]]) -> str:
    """``(pid, process)`` pairs for an error: each pid, and the exit code of those that ended (-9: SIGKILLed)."""
    return ", ".join(f"pid {pid}" + ("" if p.exitcode is None else f" (exit code {p.exitcode})")
                     for pid, p in procs) or "processes not started"


def worker_start(owner: int | None) -> None:
    """A worker process (decode or encode), first thing: safe and fast.

    - Gone with the process it works for (``owner``), even killed outright, and with its parent, the fork server
      (`_deathsig`).
    - Default SIGTERM and ignored SIGINT: a handler inherited from the parent (Lightning installs one
      for SIGTERM) must not run in a worker; on Ctrl-C the parent stops the pool.
    - One torch intra-op thread: the parent's OpenMP pool is not forked, and a parallel torch op
      (e.g. in a train ``transform``) would wait on it forever.
    - The cyclic collector's oldest generation frozen (``gc.freeze``): a worker holds the fork server's imports (torch,
      cv2, lightning: a few hundred thousand objects), which a full collection would walk again and again while the
      worker decodes; what the worker makes itself is still collected.
    - glibc serves each frame (about 1 MB at 480x640) with a fresh mmap by default, which costs hundreds of
      page faults per frame; a 64 MB threshold keeps them in the heap. The heap's top is then kept too (64 MB trim
      threshold): a fork server's child starts with a small heap, so every freed frame is its top, and the default
      128 KB trim gave it back to the kernel (``brk``) to fault it in again for the next frame, which cost a third
      of a process pass's throughput. Only our own workers are tuned.
    """
    if owner is not None:
        die_with(os.getppid())  # the fork server: long-lived, so it is still the parent this early
        exit_with(owner)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)
    gc.freeze()
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)
        libc.mallopt(_M_TRIM_THRESHOLD, _MMAP_THRESHOLD)
    except OSError:  # not glibc: nothing to tune
        pass
