"""Local shards memory-mapped under a read lease: frames without a copy, which a writer cannot cut short under them.

A mapping of a file cut short in place (``cp`` over it, ``rsync --inplace``, a truncate) turns the next touch of a page
past the new end into SIGBUS, which kills the process inside C code with no message. A read lease (``F_SETLEASE``
``F_RDLCK``, Linux) makes the kernel hold back any open of the file for writing and any truncate of it until the holder
lets go (for up to ``/proc/sys/fs/lease-break-time`` seconds), and signal the holder first. One daemon thread per
process (`_Watcher`) takes those signals (directed at it alone with ``F_SETOWN_EX``; ``SIGURG``, which any other thread
ignores) and, for each lease that is breaking: new reads stop using the mapping (`Lease.view` is None: the reader
preads, whose short reads name the shard); the mapping is closed if no slice of it is held, or else its pages are
swapped at once (``mremap``) for a private copy of the bytes they showed, so a slice still held never faults; then the
lease is let go and the writer goes on.

Where a lease is refused (another user's file without CAP_LEASE, a file open for writing, a filesystem without leases,
leases turned off, another platform) `lease` gives None and the reader preads: the same guarantee, at a copy a frame.

The watcher sleeps until a break is signalled (it wakes every `SWEEP` seconds only while a breaking lease could not be
let go yet): a pass that nothing breaks never wakes it, and it never takes the GIL from one.

For benchmarks and tests only, ``EPISODEPIPES_UNSAFE_BARE_MAPPINGS=1`` in the environment (`BARE`, read once, at the
first mapping) maps shards bare, with no lease and no watcher: what the lease costs is measured against that
(``benchmarks/bench_lease.py``), and a shard cut short under it ends the process with SIGBUS.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import logging
import mmap
import os
import signal
import struct
import sys
import threading
import weakref
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

F_SETLEASE = getattr(fcntl, "F_SETLEASE", 1024)
F_GETLEASE = getattr(fcntl, "F_GETLEASE", 1025)
F_SETSIG = getattr(fcntl, "F_SETSIG", 10)
F_SETOWN_EX = 15  # with struct f_owner_ex {int type; pid_t pid;}
F_OWNER_TID = 0
SIG = getattr(signal, "SIGURG", None)  # ignored by default by every thread that is not the watcher
SWEEP = 0.5  # seconds between the watcher's checks while a breaking lease could not be let go (`_Watcher._run`)
BARE = "EPISODEPIPES_UNSAFE_BARE_MAPPINGS"  # "1": bare mappings, no lease (benchmarks and tests only: module docstring)
MIN_BREAK = 2  # seconds of lease-break-time below which leases are not taken (the watcher needs the time)
_PROT_READ, _PROT_RW, _MAP_PRIVATE_ANON, _MREMAP = 1, 3, 0x02 | 0x20, 1 | 2  # MREMAP_MAYMOVE | MREMAP_FIXED


class Lease:
    """A shard file's mapping under a read lease: ``view`` (a memoryview of the whole file) while it holds; None
    once the lease breaks or its owner retires it (reads then go through preads). The mapping lives on while slices
    of it are held; the lease's descriptor is closed (which ends the lease) when the mapping goes (`_gone`)."""

    __slots__ = ("__weakref__", "fd", "map", "ref", "view", "addr", "size", "released", "done")

    def __init__(self, fd: int, m: mmap.mmap, size: int) -> None:
        self.fd, self.map, self.size = fd, m, size
        self.view: memoryview | None = memoryview(m)
        self.released = self.done = fd < 0  # the lease let go (`_let_go`); the descriptor closed (`_gone`)
        if self.done:  # a bare mapping (`BARE`): nothing to let go
            self.addr, self.ref = 0, None
            return
        probe = np.frombuffer(m, np.uint8)
        self.addr = probe.ctypes.data
        del probe
        me = weakref.ref(self)
        self.ref = weakref.ref(m, lambda _: _gone(me))


class _Watcher:
    """The process's lease holder: takes the break signals and lets breaking leases go (module docstring)."""

    def __init__(self) -> None:
        self.leases: dict[int, Lease] = {}  # by id, until their descriptor is closed (`_gone`)
        self.lock = threading.RLock()  # `_gone` may run in the watcher itself, as its sweep drops a last slice
        self.tid = 0
        self.wakeups = 0  # times the watcher woke (`wakeups`)
        ready = threading.Event()
        threading.Thread(target=self._run, args=(ready,), name="episodepipes-shard-leases", daemon=True).start()
        ready.wait()

    def _run(self, ready: threading.Event) -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, {SIG})
        self.tid = threading.get_native_id()
        ready.set()
        stuck = False
        while True:
            # Asleep until a break is signalled. A signal is not lost while the watcher is elsewhere (SIGURG stays
            # pending: blocked here, and directed at this thread alone), and one pending stands for any number of
            # breaks, as `sweep` checks every lease; a break during `lease` is seen there (it holds the lock).
            if stuck:
                signal.sigtimedwait({SIG}, SWEEP)
            else:
                signal.sigwaitinfo({SIG})
            self.wakeups += 1
            stuck = self.sweep()

    def sweep(self) -> bool:
        """Let go every lease that is breaking; whether one could not be let go yet (then the watcher tries again)."""
        stuck = False
        with self.lock:
            for held in list(self.leases.values()):
                if held.released or held.done:
                    continue
                try:
                    breaking = fcntl.fcntl(held.fd, F_GETLEASE) != fcntl.F_RDLCK
                except OSError:
                    breaking = True
                if breaking and not _let_go(held):
                    stuck = True
        return stuck


_WATCHER: _Watcher | None = None
_START = threading.Lock()
_BARED: bool | None = None  # `_bare`


def _watcher() -> _Watcher:
    global _WATCHER
    with _START:
        if _WATCHER is None:
            _WATCHER = _Watcher()
        return _WATCHER


def wakeups() -> int:
    """How many times this process's lease watcher has woken (for tests and the lease benchmark: a pass that nothing
    breaks wakes it never)."""
    return 0 if _WATCHER is None else _WATCHER.wakeups


def _bare() -> bool:
    """Whether `BARE` asks for bare mappings (read once; a warning says so, as reads are then unsafe)."""
    global _BARED
    if _BARED is None:
        _BARED = os.environ.get(BARE) == "1"
        if _BARED:
            log.warning("%s=1: shards are mapped without a read lease (a shard cut short ends the process with "
                        "SIGBUS); this is for benchmarks and tests only", BARE)
    return _BARED


def _usable() -> bool:
    """Whether leases can be taken here at all: Linux, and a lease-break-time the watcher has time within."""
    if not sys.platform.startswith("linux") or SIG is None or _LIBC is None:
        return False
    try:
        return int(Path("/proc/sys/fs/lease-break-time").read_text()) >= MIN_BREAK
    except (OSError, ValueError):
        return False


def lease(fd: int) -> Lease | None:
    """A mapping of the regular file ``fd`` (read-only; not closed here) under a read lease of a descriptor of its
    own; None where the lease or the mapping is refused (the caller then preads). Under `BARE`: a bare mapping of
    ``fd`` itself."""
    if _bare():
        try:
            size = os.fstat(fd).st_size
            return Lease(-1, mmap.mmap(fd, size, prot=mmap.PROT_READ), size) if size > 0 else None
        except (OSError, ValueError):
            return None
    if not _USABLE:
        return None
    try:
        own = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)  # the same file, a description of its own
    except OSError:
        return None
    w = _watcher()
    with w.lock:  # a break signalled while this is set up waits for the watcher's sweep, which then sees it
        try:
            a, b = os.fstat(fd), os.fstat(own)
            if (a.st_dev, a.st_ino) != (b.st_dev, b.st_ino) or b.st_size <= 0:
                raise OSError("not the same file, or empty")
            fcntl.fcntl(own, F_SETSIG, SIG)
            fcntl.fcntl(own, F_SETLEASE, fcntl.F_RDLCK)
            fcntl.fcntl(own, F_SETOWN_EX, struct.pack("ii", F_OWNER_TID, w.tid))
            if fcntl.fcntl(own, F_GETLEASE) != fcntl.F_RDLCK:  # a writer came before the signal was the watcher's
                raise OSError("lease breaking")
            held = Lease(own, mmap.mmap(own, b.st_size, prot=mmap.PROT_READ), b.st_size)
        except (OSError, ValueError) as e:
            log.debug("no lease on fd %d (%s): frames are read with preads", fd, e)
            os.close(own)
            return None
        w.leases[id(held)] = held
    return held


def retire(leases: list[Lease]) -> None:
    """Their owner is done with ``leases``: each mapping (and lease) goes when its last slice does."""
    for held in leases:
        held.view = held.map = None


def _let_go(held: Lease) -> bool:
    """Stop using ``held``'s mapping for new reads; where slices of it are still held, swap in a private copy of
    its pages; then end the lease, so the waiting writer goes on (the descriptor closes with the mapping). False
    where the copy could not be made (the writer waits, up to lease-break-time, while the watcher tries again)."""
    held.view = held.map = None  # the mapping goes here unless a slice holds it (then `_gone` comes later)
    m = held.ref()
    if m is not None and not _privatize(held):
        return False
    del m
    held.released = True
    if not held.done:
        with contextlib.suppress(OSError):
            fcntl.fcntl(held.fd, F_SETLEASE, fcntl.F_UNLCK)
    return True


def _gone(me: weakref.ref) -> None:
    """The mapping of a lease was unmapped (its last slice went): close the lease's descriptor, ending the lease."""
    held = me()
    w = _WATCHER
    if held is None or w is None:
        return
    with w.lock:
        if not held.done:
            held.done = True
            os.close(held.fd)
            w.leases.pop(id(held), None)


def _privatize(held: Lease) -> bool:
    """Replace the pages of ``held``'s mapping in one step by a private copy of the bytes they show (the writer is
    still held back, so these are the bytes read so far): slices of it stay valid, and never fault once the file
    is cut short. The mapping object unmaps the copy when its last slice goes."""
    size, at = held.size, held.addr
    new = _LIBC.mmap(None, size, _PROT_RW, _MAP_PRIVATE_ANON, -1, 0)
    if new is None or new == ctypes.c_void_p(-1).value:
        log.error("no memory to copy a mapped shard (%d bytes) whose lease is breaking", size)
        return False
    ctypes.memmove(new, at, size)
    _LIBC.mprotect(new, size, _PROT_READ)
    if _LIBC.mremap(new, size, size, _MREMAP, at) != at:
        _LIBC.munmap(new, size)
        log.error("could not swap a copy into a mapped shard whose lease is breaking (errno %d)", ctypes.get_errno())
        return False
    return True


def _forget() -> None:
    """In a forked child: the leases are the parent's (its watcher lets them go, and swaps its own pages only),
    so the child reads with preads; it starts its own watcher if it takes leases."""
    global _WATCHER, _START
    if _WATCHER is not None:
        for held in _WATCHER.leases.values():
            held.view = None
    _WATCHER, _START = None, threading.Lock()  # a thread of the parent may have held it


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                              ctypes.c_long)
        libc.mmap.restype = ctypes.c_void_p
        libc.mremap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)
        libc.mremap.restype = ctypes.c_void_p
        libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _libc() if sys.platform.startswith("linux") else None
_USABLE = _usable()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget)
