"""Worker processes that die with their parent (Linux), shared by the shard writer's encoders and the decode pools.

A process killed outright (SIGKILL, the OOM killer, a scheduler's timeout) runs no cleanup: its workers would go on
waiting on their task pipe forever, holding memory and file descriptors. ``PR_SET_PDEATHSIG`` has the kernel kill a
child when its parent dies (`die_with`). A child of a fork server has the server as its parent, and the server lives
as long as any of its children holds its liveness pipe, which they all do: such a child watches the process it works
for instead (`exit_with`).
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import sys
import threading
import time

_PR_SET_PDEATHSIG = 1  # prctl(2)


def die_with(parent: int) -> None:
    """Have the kernel SIGKILL this process when its parent ``parent`` dies (Linux; elsewhere nothing happens).

    Call it first thing in the child, with the pid its parent had before the fork: a parent that died before the
    call sends no signal, so the child then exits at once. The signal follows the parent *thread* that forked."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # no prctl in this libc: the worker lives on, as on other systems
        return
    if os.getppid() != parent:  # the parent died before the call: no signal will come
        os._exit(1)


def exit_with(pid: int) -> None:
    """Exit this process (``os._exit``) as soon as process ``pid``, which need not be its parent, has ended.

    A daemon thread waits on a pidfd (Linux 5.3+: woken the moment ``pid`` exits) or, without one, polls every
    second. A ``pid`` already gone exits at once."""
    try:
        fd: int | None = os.pidfd_open(pid)  # type: ignore[attr-defined]
    except ProcessLookupError:
        os._exit(1)
    except (AttributeError, OSError):
        fd = None

    def watch() -> None:
        if fd is not None:
            select.select([fd], [], [])
        else:
            while True:
                time.sleep(1.0)
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                except PermissionError:  # alive, under another user
                    pass
        os._exit(1)

    threading.Thread(target=watch, name="episodepipes-exit-with", daemon=True).start()
