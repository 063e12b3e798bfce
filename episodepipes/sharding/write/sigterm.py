"""SIGTERM during a write: save the progress of the last finished shard, then end as SIGTERM would have.

Slurm's ``scancel`` and its job time limit (and Kubernetes, systemd) send SIGTERM, then SIGKILL some seconds later
(Slurm's ``KillWait``, 30 by default). With Python's default the writer died at once, and a resume redid every shard
finished since the last save (`episodepipes.sharding.write.saves`). For the duration of a write, `saved_on_sigterm`
turns the first SIGTERM into `Terminated`, raised in the main thread: the write leaves by its error path, which
waits for the shard being appended, saves the newest finished shard's progress and releases the lock; then the
previous handler is put back and the signal raised again, so the process ends by SIGTERM (or the previous handler
decides). A second SIGTERM meanwhile is ignored. Nothing is installed off the main thread (Python runs signal
handlers there only) or where SIGTERM is ignored.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator

log = logging.getLogger(__name__)


class Terminated(BaseException):
    """SIGTERM arrived during a write. A BaseException, as KeyboardInterrupt is: no ``except Exception`` swallows it."""


@contextlib.contextmanager
def saved_on_sigterm(where: object) -> Iterator[None]:
    """Within: SIGTERM raises `Terminated` in the main thread (once). After the block has unwound from it: the
    previous handler back, and SIGTERM raised again; `Terminated` if that handler returns. ``where`` names the
    output in the log line."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous in (signal.SIG_IGN, None):  # ignored, or a handler not installed from Python: left alone
        yield
        return
    fired: list[int] = []

    def handler(signum: int, frame: object) -> None:
        if not fired:
            fired.append(signum)
            raise Terminated(f"{where}: stopped by SIGTERM; re-run the same command to resume")

    signal.signal(signal.SIGTERM, handler)
    try:
        yield
    except BaseException:
        if not fired:
            raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    if fired:
        log.warning("%s: stopped by SIGTERM after saving the progress of the last finished shard; re-run the same "
                    "command to resume", where)
        signal.raise_signal(signal.SIGTERM)  # the default ends the process here; a handler of the caller's runs
        raise Terminated(f"{where}: stopped by SIGTERM; re-run the same command to resume")
