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

import multiprocessing as mp
import os
import sys
from collections.abc import Sequence

from episodepipes._deathsig import die_with, exit_with

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


def tie_to(owner: int) -> None:
    """In a worker, first thing: end with the fork server (its parent) and with ``owner``, the process it works for,
    even killed outright (`_deathsig`)."""
    die_with(os.getppid())  # the fork server: long-lived, so it is still the parent this early
    exit_with(owner)
