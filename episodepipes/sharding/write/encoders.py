"""The encoders of `write_shards`: one task reads and encodes one episode, in this process, a thread or a pool.

Results come back in task order, so the output never depends on timing or on the number of workers. A write that
copies packets (``codec="copy"``) has little work per episode besides demuxing and I/O, so its episodes run in one
thread beside the writer, and the process pool starts only when an episode turns out to have frames to encode (an
image feature): starting the pool and passing every episode through a spool file cost more than the work it spread.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import itertools
import mmap
import os
import sys
from collections.abc import Iterator
from concurrent.futures.process import BrokenProcessPool, ProcessPoolExecutor
from multiprocessing import reduction
from multiprocessing.process import BaseProcess
from pathlib import Path

import cv2

from episodepipes import _forkserver, safefile
from episodepipes.errors import WorkerError
from episodepipes.format import safe_field
from episodepipes.normstats.fields import episode_part
from episodepipes.sharding.episode import EpisodeError
from episodepipes.sharding.write.encode import EncodedEpisode, encode_episode

_IOV_MAX = 1024  # POSIX's minimum IOV_MAX is 16, but Linux, macOS and the BSDs take 1024
_decode_threads = 0  # 0: the decoder's own choice (a thread per core); a worker gets its share of the cores
SLOT_BYTES = 64 * 2**20  # a pooled episode up to this many tar bytes comes back in shared memory, a larger one spooled
_slots: Slots | None = None  # a worker's view of its pool's slots (set by `_init`)
PRELOAD = (__name__,)  # what a fork server started by a write imports before it forks the encoders


def decode_threads() -> int:
    """Threads a video decoder in this process should use: 0 (FFmpeg's choice) outside a pool, else
    cores // workers: a thread per core in every worker oversubscribes the cores and costs CPU."""
    return _decode_threads


class Slots:
    """Shared memory the encoder processes hand their episodes' tar bytes back in, one slot per episode in flight.

    A spool file costs a copy into the page cache in the worker, then page faults in the writer and the file's
    freeing, for every episode; a slot is mapped once per write and reused. It is a memfd, given to each worker as a
    descriptor as the fork server starts it (pickled with `multiprocessing.reduction.DupFd`). Pages are touched only
    as far as episodes fill them, so a slot's size is a cap, not memory taken.
    """

    def __init__(self, count: int, size: int, fd: int | None = None) -> None:
        self.count, self.size = count, size
        if fd is None:
            fd = os.memfd_create("episodepipes-slots", os.MFD_CLOEXEC)
            os.ftruncate(fd, count * size)
        self.fd, self.mm = fd, mmap.mmap(fd, count * size, flags=mmap.MAP_SHARED)
        self.free = collections.deque(range(count))

    @staticmethod
    def supported() -> bool:
        """Shared slots need a memfd (Linux) and a fork server to pass it; elsewhere episodes come back spooled."""
        return hasattr(os, "memfd_create") and _forkserver.start_method() == "forkserver"

    def __reduce__(self) -> tuple:
        return _attach_slots, (self.count, self.size, reduction.DupFd(self.fd))

    def put(self, slot: int, enc: EncodedEpisode) -> int | None:
        """Copy ``enc``'s tar bytes into ``slot``; their byte count, or None when they do not fit."""
        total = sum(enc.sizes)  # the frames' shares add up to the episode's bytes
        if total > self.size:
            return None
        start = slot * self.size  # one join and one copy: a slice assignment per part costs more in Python
        self.mm[start:start + total] = enc.data()
        return total

    def close(self) -> None:
        try:
            self.mm.close()
        except BufferError:  # a view is still held by the traceback of an error in flight: freed with it
            pass
        os.close(self.fd)


def _attach_slots(count: int, size: int, dup: reduction.DupFd) -> Slots:
    return Slots(count, size, dup.detach())


def _encode(task: tuple, slot: int | None = None) -> tuple:
    """Worker: `_encode_one`'s result."""
    return _encode_one(task, slot)[0]


def _encode_one(task: tuple, slot: int | None = None) -> tuple[tuple, bool]:
    """Read and encode one episode. Input errors come back as values, to be skipped or raised.

    ``split`` is the split chosen by an option; it replaces the episode's own split when ``override``
    (``--val-episodes``), else only fills it in (``--val-fraction``). The result says where the split
    came from: "option", "metadata" or "default" (train), and carries the episode's array statistics
    (`episode_part`), made here in parallel so that the single writer only folds them in.

    With a ``spool`` folder the tar bytes go to a file there and only its name and the frame sizes
    return: pickling megabytes through the pool's pipe cost the parent more CPU than hashing and
    writing them, and the parent is the one process that cannot be parallelised. A failed spool write
    (a full disk) is not the episode's fault: it is raised, never skipped as a bad episode. With a ``slot``
    of the pool's `Slots` the bytes go there instead, and only ``("slot", slot, nbytes)`` returns, unless
    the episode is larger than a slot.

    The flag says whether the episode had frames to encode (cameras that are not copied packets).
    """
    reader, eid, split, override, opts, spool = task
    framed = False
    try:
        ep = reader.read(eid)
        framed = bool(ep.cameras)
        origin = "metadata" if ep.split is not None else "default"
        if split is not None and (override or ep.split is None):
            ep.split, origin = split, "option"
        if ep.split not in (None, "train", "val"):
            raise EpisodeError(f"episode {eid!r}: split {ep.split!r} is not 'train' or 'val'; fix its metadata "
                               "or pass --val-episodes")
        enc = encode_episode(ep, opts)
    except (EpisodeError, ValueError, OSError, cv2.error) as e:
        msg = str(e) if isinstance(e, EpisodeError) else f"episode {eid!r}: {type(e).__name__}: {e}"
        return ("bad", eid, msg), framed
    stats = episode_part(enc.meta["id"], {safe_field(k): v for k, v in ep.arrays.items()})
    if spool is None:
        return ("ok", enc.meta, (enc.data(), enc.sizes), origin, stats), framed
    if slot is not None and _slots is not None and (nbytes := _slots.put(slot, enc)) is not None:
        return ("ok", enc.meta, (("slot", slot, nbytes), enc.sizes), origin, stats), framed
    path = Path(spool) / f"{enc.meta['id']}.samples"
    fd = safefile.create(path)  # the spool is OUT/_spool: a link planted there is refused
    try:
        _write_parts(fd, enc)
    finally:
        os.close(fd)
    return ("ok", enc.meta, (str(path), enc.sizes), origin, stats), framed


def _write_parts(fd: int, enc: EncodedEpisode) -> None:
    """``enc``'s parts with few gathering ``writev`` calls: no joined copy of the episode. Counted in parts, not
    frames: a packed (video) episode has fewer parts than frames, a chunk's member holding many frames."""
    for i in range(0, len(enc.parts), _IOV_MAX):
        chunk = enc.parts[i:i + _IOV_MAX]
        want = sum(memoryview(x).nbytes for x in chunk)
        done = os.writev(fd, chunk)
        if done < want:  # a short write (a signal, a full disk): finish it plainly, or fail with the OSError
            rest = memoryview(b"".join(chunk))[done:]
            while rest:
                rest = rest[os.write(fd, rest):]


@contextlib.contextmanager
def samples(payload: tuple) -> Iterator[tuple]:
    """(tar bytes, frame sizes) of a worker result: as sent, or memory-mapped (no copy) from its spool file."""
    data, sizes = payload
    if not isinstance(data, str):
        yield data, sizes
        return
    with open(data, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            with memoryview(mm) as view:
                yield view, sizes
        finally:
            try:
                mm.close()
            except BufferError:  # a slice is still held by the traceback of the error in flight: keep that
                pass  # error (a BufferError would hide it); the mapping is freed with the traceback
    os.unlink(data)


def _init(threads: int, owner: int, slots: Slots | None) -> None:
    """An encoder process, first thing: made safe and fast (`_forkserver.worker_start`), then one OpenCV thread (one
    process per core already; more would only contend; safe to set in a fork server's child, which has no thread
    pool yet)."""
    global _decode_threads, _slots
    _forkserver.worker_start(owner)
    _decode_threads, _slots = threads, slots
    cv2.setNumThreads(1)


def start_early(workers: int, codec: str, reader_module: str) -> None:
    """Start the fork server of a write that will run encoder processes (``workers > 1``, a codec that encodes), so
    that its interpreter and imports overlap the opening of the source and the plan; a copy write may never need it.
    It imports the reader's module too (``reader_module``: a format's parquet or zarr libraries), which each encoder
    would otherwise import again for every write."""
    if workers > 1 and codec != "copy":
        _forkserver.start((*PRELOAD, reader_module))


def encoded(tasks: list[tuple], workers: int, *, threaded: bool = False,
            slot_bytes: int = SLOT_BYTES) -> Iterator[tuple]:
    """`_encode` over ``tasks`` in order: in this process, or in ``workers`` processes (`_pooled`).

    ``threaded`` (copied packets, little to encode): with ``workers > 1`` the tasks run in one thread beside the
    caller (demuxing, parquet reads and the caller's hashing and writing release the GIL) until an episode has
    frames to encode; the tasks after it go to the pool, started then. A pooled episode's tar bytes come back
    in shared memory (`Slots` of ``slot_bytes`` each) when it fits and the platform can share it, else in its spool
    file.
    """
    if workers <= 1:
        yield from map(_encode, tasks)
        return
    done = 0
    if threaded:
        for res in _threaded(tasks, 2 * workers):
            done += 1
            yield res
    if done < len(tasks):
        yield from _pooled(tasks[done:], workers, slot_bytes)


def _threaded(tasks: list[tuple], ahead: int) -> Iterator[tuple]:
    """Results of ``tasks`` run one at a time in a thread, at most ``ahead`` in flight, stopping after the first
    episode with frames to encode (and the tasks already started then). The results stay in memory (no spool)."""
    ex = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="episodepipes-copy")
    try:
        todo, window = iter(tasks), collections.deque()
        for task in itertools.islice(todo, ahead):
            window.append(ex.submit(_encode_one, (*task[:-1], None)))
        while window:
            res, framed = window.popleft().result()
            yield res
            if framed:  # the pool takes over from the first task not yet started (one thread: they are the last)
                while window and window[-1].cancel():
                    window.pop()
                for fut in window:
                    yield fut.result()[0]
                return
            for task in itertools.islice(todo, 1):
                window.append(ex.submit(_encode_one, (*task[:-1], None)))
    finally:
        ex.shutdown(wait=True, cancel_futures=True)


def _pooled(tasks: list[tuple], workers: int, slot_bytes: int = SLOT_BYTES) -> Iterator[tuple]:
    """`_encode` over ``tasks`` in order in ``workers`` processes started by a fork server (`_forkserver`: a fork of
    this process could inherit a lock one of its threads held, and hang on it).

    A result's slot (`Slots`) is reused once the caller has taken the result and asked for the next one. A worker that
    dies (the OOM killer, a signal) ends the write with a `WorkerError` naming the episodes in flight (which one it
    held is not known), never a wait without end; the workers of a write that stops early are killed, not waited for.
    """
    _check_importable(tasks[0][0])
    slots = Slots(2 * workers, slot_bytes) if slot_bytes > 0 and Slots.supported() else None
    ex = ProcessPoolExecutor(workers, mp_context=_forkserver.context(PRELOAD), initializer=_init,
                             initargs=(max(1, (os.cpu_count() or 1) // workers), os.getpid(), slots))
    procs: dict[int, BaseProcess] = {}  # pid -> process as the executor starts them (no public list): error, kill
    finished = False
    try:
        # a bounded window, not an unbounded read-ahead: encoders faster than the writer would
        # otherwise spool up to the whole dataset, on the disk the shards need
        todo, window = iter(tasks), collections.deque()

        def submit(task: tuple) -> None:
            slot = slots.free.popleft() if slots is not None else None
            window.append((ex.submit(_encode, task, slot), slot, task[1]))
            procs.update(getattr(ex, "_processes", None) or {})

        for task in itertools.islice(todo, 2 * workers):
            submit(task)
        while window:
            pending, slot, eid = window.popleft()
            try:
                res = pending.result()
            except BrokenProcessPool:
                ids = ", ".join(repr(e) for e in (eid, *(w[2] for w in window)))
                raise WorkerError(f"an encoder process died ({_forkserver.listed(sorted(procs.items()))}) with "
                                  f"episodes {ids} in flight; exit code -9 (SIGKILL) is most often the OOM killer: "
                                  "re-run with fewer workers (a resume keeps the shards finished); otherwise its "
                                  "error is on stderr above") from None
            if res[0] == "ok" and isinstance(res[2][0], tuple):  # ("slot", slot, nbytes): a view, no copy
                with memoryview(slots.mm) as mm:
                    start = slot * slots.size
                    with mm[start:start + res[2][0][2]] as view:
                        yield (*res[:2], (view, res[2][1]), *res[3:])
            else:
                yield res
            if slot is not None:
                slots.free.append(slot)
            for task in itertools.islice(todo, 1):
                submit(task)
        finished = True
    finally:
        if not finished:  # an error or an early close: the episodes in flight are not wanted
            for p in procs.values():
                if p.exitcode is None:
                    p.kill()
        ex.shutdown(wait=True, cancel_futures=True)
        if slots is not None:
            slots.close()


def _check_importable(reader: object) -> None:
    """Encoder processes start from a clean interpreter, import the main module from its file as spawned processes
    do, and the reader's class by name: a main read from stdin (no such file) would kill each of them, and so would a
    class defined in the ``__main__`` of an interactive session or of ``python -c`` (no file to import)."""
    cls, main = type(reader), sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if isinstance(path, str) and not os.path.isfile(path):
        raise ValueError(f"the main module's file {path!r} does not exist, and encoder processes import it as "
                         "spawned processes do; run the script from a file, or write with workers=1")
    if cls.__module__ == "__main__" and not path:
        raise ValueError(f"reader class {cls.__qualname__} is defined in __main__ of an interactive session or "
                         "`python -c`, which encoder processes cannot import; define it in a module (a .py file) "
                         "or write with workers=1")
