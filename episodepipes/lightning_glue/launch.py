"""`run_ranks`: start every DDP rank of a script as its own process, wait for all of them, check each exit.

When Lightning starts the extra ranks itself (``python train.py`` with ``devices=2``), only rank 0's exit
status reaches the caller: a rank that dies after rank 0 has finished (a native abort at interpreter exit,
say) goes unnoticed. Here each rank is started with Lightning's documented environment for externally
launched processes (``LOCAL_RANK``, ``NODE_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``), so
Lightning starts nothing, and every rank's status is seen. Logs go to files, one per rank, not pipes: a
pipe nobody reads fills up and blocks the rank writing to it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from episodepipes import safefile

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RankExit:
    """How one rank ended: ``returncode`` as `subprocess` gives it (negative: killed by that signal)."""

    rank: int
    returncode: int
    log: Path
    killed_by_us: bool = False  # it outlived the deadline, or another rank's failure, and was stopped

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.killed_by_us

    def describe(self) -> str:
        """``rank 1 was killed by SIGABRT`` / ``rank 0 exited with status 3`` / ``rank 0 exited cleanly``."""
        if self.returncode < 0:
            how = f"was killed by {signal.Signals(-self.returncode).name}"
        elif self.returncode:
            how = f"exited with status {self.returncode}"
        else:
            how = "exited cleanly"
        return f"rank {self.rank} {how}" + (" (stopped by run_ranks)" if self.killed_by_us else "")

    def tail(self, lines: int = 20) -> str:
        """The last ``lines`` lines of this rank's log."""
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError as e:
            return f"(no log: {e})"


class RanksFailed(RuntimeError):
    """At least one rank did not exit cleanly; ``exits`` holds every rank's `RankExit`."""

    def __init__(self, exits: list[RankExit], lines: int = 20) -> None:
        self.exits = exits
        bad = [e for e in exits if not e.ok]
        parts = [f"{e.describe()}; last lines of {e.log}:\n{e.tail(lines)}" for e in bad]
        super().__init__(f"{len(bad)} of {len(exits)} ranks failed: " + ", ".join(e.describe() for e in bad)
                         + "\n\n" + "\n\n".join(parts))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the rendezvous port for the ranks)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(cmd: Sequence[str | os.PathLike], *, nprocs: int, log_dir: str | os.PathLike, timeout: float,
              env: Mapping[str, str] | None = None, cwd: str | os.PathLike | None = None,
              grace: float = 15.0) -> list[RankExit]:
    """Run ``cmd`` once per rank (``nprocs`` ranks on this machine) and wait for every one of them.

    Args:
        cmd: the script's command line, the same for every rank.
        nprocs: number of ranks; the Trainer must use ``devices=nprocs``.
        log_dir: each rank's stdout and stderr go to ``<log_dir>/rank<r>.log``.
        timeout: seconds for the whole run; ranks still running then are stopped (SIGTERM, then SIGKILL,
            since Lightning handles SIGTERM) and reported as failed.
        env: the ranks' environment (default: this process's), to which the rendezvous variables are added.
        cwd: the ranks' working directory.
        grace: once a rank has failed, seconds the others get to exit on their own before they are stopped
            (they are usually stuck in a collective with the dead rank).

    Returns every rank's `RankExit`, in rank order; call `check_ranks` on it to raise on any failure.
    """
    if isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs < 1:
        raise ValueError(f"nprocs={nprocs!r} should be a positive int")
    logs = Path(log_dir)
    logs.mkdir(parents=True, exist_ok=True)
    base = {**(os.environ if env is None else env), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
            "NODE_RANK": "0", "WORLD_SIZE": str(nprocs)}
    procs: list[subprocess.Popen] = []
    for r in range(nprocs):
        with safefile.open_new(logs / f"rank{r}.log") as out:  # the child keeps its own descriptor; no link
            # a session per rank: stopping it stops whatever the rank started (decode workers) too
            procs.append(subprocess.Popen([str(c) for c in cmd], env={**base, "LOCAL_RANK": str(r)}, cwd=cwd,
                                          stdout=out, stderr=subprocess.STDOUT, start_new_session=True))
    deadline = time.monotonic() + timeout
    stopped: set[int] = set()
    try:
        while any(p.poll() is None for p in procs):
            failed = any(p.returncode not in (None, 0) for p in procs)
            if time.monotonic() > deadline:
                stopped |= _stop([r for r, p in enumerate(procs) if p.poll() is None], procs)
            elif failed:
                deadline = min(deadline, time.monotonic() + grace)
            time.sleep(0.1)
    finally:
        stopped |= _stop([r for r, p in enumerate(procs) if p.poll() is None], procs)
        for p in procs:  # reap the rank's own children (a session each) even when it exited cleanly
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
    return [RankExit(r, p.returncode, logs / f"rank{r}.log", r in stopped) for r, p in enumerate(procs)]


def check_ranks(exits: list[RankExit], *, lines: int = 20) -> None:
    """Raise `RanksFailed` (naming each failed rank, its status and its log's last ``lines`` lines) unless all ok."""
    if not all(e.ok for e in exits):
        raise RanksFailed(exits, lines)


def _stop(ranks: list[int], procs: list[subprocess.Popen]) -> set[int]:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for r in ranks:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(procs[r].pid, sig)
        t = time.monotonic() + 5
        while time.monotonic() < t and any(procs[r].poll() is None for r in ranks):
            time.sleep(0.05)
    for r in ranks:
        procs[r].wait()
    if ranks:
        log.warning("stopped rank(s) %s: past the deadline or after another rank failed", ranks)
    return set(ranks)
