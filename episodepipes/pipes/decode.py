"""`Decoder`: samples' JPEG members to uint8 RGB ``[3, H, W]`` frames in a pool of threads or processes.

`cv2.imdecode` releases the GIL, so threads scale and cost no start-up; processes are there for
graphs whose other stages hold the GIL. Either way the workers write each frame straight into its
row of a batch buffer (`episodepipes.pipes._slabs`), and the pool lives for one pass. Where the
target size is at most 1/2, 1/4 or 1/8 of the source, libjpeg's reduced decode
(`cv2.IMREAD_REDUCED_COLOR_*`) does most of the resize for free.
"""

from __future__ import annotations

import functools
import io
import json
import logging
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import cv2
import numpy as np
from torchdata.nodes import BaseNode

from episodepipes.format import npy_header, npy_load
from episodepipes.index import EpisodeIndex
from episodepipes.pipes import _pool
from episodepipes.pipes._lifecycle import shutdown_node
from episodepipes.pipes._slabs import Slabs, worker_rows
from episodepipes.pipes.read import RawSample
from episodepipes.pipes.stats import Stats

log = logging.getLogger(__name__)
METHODS = ("thread", "process")
ON_CORRUPT = ("skip", "raise")
_REDUCED = ((8, cv2.IMREAD_REDUCED_COLOR_8), (4, cv2.IMREAD_REDUCED_COLOR_4), (2, cv2.IMREAD_REDUCED_COLOR_2))


def reduced_flag(src: tuple[int, int], dst: tuple[int, int] | None) -> int:
    """The cheapest `cv2.imdecode` flag whose output is still at least ``dst`` in both dimensions."""
    return _reduced(src, dst)[0]


def _reduced(src: tuple[int, int], dst: tuple[int, int] | None) -> tuple[int, int]:
    """(`reduced_flag`, the factor libjpeg divides each dimension by, rounding up)."""
    if dst is not None:
        for f, flag in _REDUCED:
            if dst[0] * f <= src[0] and dst[1] * f <= src[1]:
                return flag, f
    return cv2.IMREAD_COLOR, 1


def decode_jpeg(data: bytes, *, src: tuple[int, int], size: tuple[int, int] | None = None,
                out: np.ndarray | None = None) -> np.ndarray | None:
    """uint8 RGB ``[3, H, W]`` at ``size`` (or the source size), written into ``out`` if given;
    None when the bytes do not decode, or decode to another size than ``src`` (the index's): such a
    frame is not the one the index describes, so it is corrupt, never resized into place."""
    flag, f = _reduced(src, size)
    bgr = cv2.imdecode(np.frombuffer(data, np.uint8), flag)
    if bgr is None or bgr.shape[0] != -(-src[0] // f) or bgr.shape[1] != -(-src[1] // f):
        return None
    if size is not None and bgr.shape[:2] != tuple(size):
        bgr = cv2.resize(bgr, (size[1], size[0]), interpolation=cv2.INTER_AREA)
    if out is None or out.shape != (3, *bgr.shape[:2]):
        out = np.empty((3, *bgr.shape[:2]), np.uint8)
    cv2.split(bgr, [out[2], out[1], out[0]])  # BGR HWC -> RGB CHW in one SIMD pass, into out's planes
    return out


@functools.lru_cache(maxsize=1024)
def _npy_layout(dtype: str, shape: tuple[int, ...]) -> tuple[np.dtype, bytes, int]:
    """(dtype, the exact .npy header the writer puts before such an array, data bytes)."""
    dt = np.dtype(dtype)
    return dt, npy_header(dt, shape), dt.itemsize * int(np.prod(shape, dtype=np.int64))


def load_npy(data: bytes, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """An .npy member that must hold exactly ``dtype`` (a full dtype string such as ``">f4"``) and ``shape``,
    returned in native byte order (torch takes no other; the swap is exact).

    A member whose header is byte for byte the one the writer makes for them is a view of its tail,
    with no header parse (`np.lib.format.read_array` parses it with `ast.literal_eval`). Anything else
    is parsed, and kept only if it holds that dtype (byte order included) and shape: a member that
    does not is a ValueError, never reinterpreted.
    """
    dt, head, nbytes = _npy_layout(dtype, tuple(shape))
    if len(data) == len(head) + nbytes and data[:len(head)] == head:
        a = np.frombuffer(data, dt, offset=len(head)).reshape(shape)
    else:
        try:
            a = np.lib.format.read_array(io.BytesIO(data), allow_pickle=False)
        except Exception as e:  # data from a shard: any failure to parse it is a corrupt member
            raise ValueError(f"not a readable .npy member ({type(e).__name__}: {e})") from None
        if a.dtype != dt or a.shape != tuple(shape):
            raise ValueError(f"the .npy member holds {a.dtype.str} {a.shape}, the index says {dt.str} {tuple(shape)}")
    return a if dt.isnative else a.astype(dt.newbyteorder("="))


def check_options(*, method: str, on_corrupt: str, num_workers: int) -> None:
    """Refuse bad decode options where a pipe is built, long before its first open pass builds a `Decoder`."""
    if method not in METHODS:
        raise ValueError(f"method={method!r} should be one of {METHODS}")
    if on_corrupt not in ON_CORRUPT:
        raise ValueError(f"on_corrupt={on_corrupt!r} should be one of {ON_CORRUPT}")
    if num_workers < 1:
        raise ValueError(f"num_workers={num_workers} should be >= 1")


def decode_members(members: dict[str, bytes], cameras: dict[str, tuple[int, int]],
                   size: tuple[int, int] | None,
                   arrays: dict[str, tuple[str, tuple[int, ...]]] | None = None,
                   dest: dict[str, np.ndarray] | None = None) -> tuple[dict[str, Any], list[str]]:
    """Decode one sample's members; returns (fields, corrupt camera and array names). Runs in a worker.

    ``arrays`` (key -> (dtype, shape) from the index) is what each .npy member must hold; one that
    does not is corrupt and comes back as zeros of that dtype and shape. ``dest`` (camera ->
    ``[3, H, W]`` array) is where to write each frame (a row of the batch buffer, for threads).
    """
    out: dict[str, Any] = {}
    bad: list[str] = []
    for cam, src in cameras.items():
        data = members.get(f"{cam}.jpg")
        slot = dest.get(cam) if dest else None
        img = None if data is None else decode_jpeg(data, src=src, size=size, out=slot)
        if img is None:
            bad.append(cam)
            img = slot if slot is not None else np.empty((3, *(size or src)), np.uint8)
            img[...] = 0
        out[cam] = img
    for field, data in members.items():
        if field.endswith(".npy"):
            key = field[:-4]
            spec = (arrays or {}).get(key)
            if spec is None:
                out[key] = npy_load(data)
                continue
            try:
                out[key] = load_npy(data, *spec)
            except ValueError:
                bad.append(key)
                out[key] = np.zeros(spec[1], np.dtype(spec[0]))
    if "json" in members:
        out["timestamp"] = float(json.loads(members["json"])["timestamp"])
    return out, bad


def decode_shared(members: dict[str, bytes], cameras: dict[str, tuple[int, int]], size: tuple[int, int] | None,
                  arrays: dict[str, tuple[str, tuple[int, ...]]] | None,
                  addr: tuple[int, int, int]) -> tuple[dict[str, Any], list[str]]:
    """In a decode process: decode into the shared rows ``addr`` names, and send back all but the frames."""
    fields, bad = decode_members(members, cameras, size, arrays, worker_rows(addr))
    for cam in cameras:
        fields.pop(cam, None)
    return fields, bad


def decode_chunk(calls: list[tuple[Callable[..., tuple[dict[str, Any], list[str]]], tuple]]
                 ) -> list[tuple[dict[str, Any], list[str]]]:
    """In a decode process: ``fn(*args)`` for each ``(fn, args)`` of a few consecutive samples (one message
    each way, not one per sample)."""
    return [fn(*args) for fn, args in calls]


class Decoder(BaseNode[dict]):
    """Decode `RawSample`s in order with up to ``prefetch`` in flight; the pool lives for one pass.

    Corrupt data (a JPEG that does not decode at the index's size, an .npy member that is not the index's
    dtype and shape, or a sample whose bytes fail the index's CRC32: ``RawSample.damaged``, every camera
    and array then) is replaced by zeros and the sample marked ``valid=False`` (so lengths stay exact),
    counted in ``stats["frames_corrupt"]`` and logged with its shard, episode, frame and cameras/arrays,
    or raised (``on_corrupt="raise"``). ``shutdown()`` ends a pass early; its state still resumes there.
    ``fn`` replaces `decode_members` as the per-sample worker function (train windows use it); if it
    decodes other than one JPEG per camera, its ``fn.jpegs(members, cameras)`` says how many, so
    ``stats["frames_decoded"]`` counts every JPEG decoded (counted here, from the members, for both methods).
    Processes whose frames come back pickled (``fn`` given, or no ``slab``) get ``chunk`` consecutive
    samples per task, and ``prefetch`` defaults to two chunks per worker: a task costs the parent two
    pickled messages and wake-ups of the pool's threads, CPU the workers lack on 2 cores (train_pipe,
    224x224 with a camera window: parent 0.29 -> 0.19 ms a frame, 1900 -> 2600 frames/s). Processes
    writing into shared rows send back a few small arrays per sample, and gained nothing from chunks
    (parent 0.13 ms a frame either way); they, and threads, take one sample per task.
    ``slab`` (the batch size) makes workers decode into batch rows; pass a `Slabs` instead to keep
    those buffers across passes (a pipe gives one to every pass's decoder: no page faults after the first).
    """

    SOURCE_KEY = "source"

    def __init__(self, source: BaseNode[RawSample], index: EpisodeIndex, *, num_workers: int = 2,
                 method: str = "thread", resize: tuple[int, int] | None = None, on_corrupt: str = "skip",
                 prefetch: int | None = None, stats: Stats | None = None,
                 fn: Callable[..., tuple[dict[str, Any], list[str]]] = decode_members, slab: int | Slabs = 0,
                 chunk: int = 8) -> None:
        super().__init__()
        check_options(method=method, on_corrupt=on_corrupt, num_workers=num_workers)
        if chunk < 1:
            raise ValueError(f"chunk={chunk} should be >= 1")
        self.source, self.index, self.method, self.num_workers = source, index, method, num_workers
        self.resize = None if resize is None else (int(resize[0]), int(resize[1]))
        self.on_corrupt = on_corrupt
        self.stats = stats if stats is not None else Stats()
        self.fn = fn  # fn(members, cameras, resize) -> (fields, corrupt cameras); picklable for processes
        self._pool: _pool.Pool | None = None
        # (source state before the sample, the sample, its task, shared rows it was written into, its place in the task)
        self._pending: deque[tuple[dict, RawSample, Future, dict | None, int]] = deque()
        self._calls: list[tuple[Callable, tuple, tuple]] = []  # read, not yet submitted: (fn, args, pending entry)
        self._spec_cache: dict[str, tuple[dict, dict]] = {}
        # Workers decode straight into rows of ``[slab, 3, H, W]`` buffers; with ``slab`` equal to the
        # BatchStacker's batch size, a batch is a view of one buffer: no pixel copy.
        slabs = slab if isinstance(slab, Slabs) else Slabs(slab) if slab else None
        # Processes find the shared ring by inheriting it: without fork their frames come back pickled.
        inherit = method == "thread" or _pool.start_method() == "fork"
        self._slabs = slabs if fn is decode_members and inherit else None
        self.slab = self._slabs.size if self._slabs is not None else 0
        pickled = method == "process" and self._slabs is None
        self.prefetch = prefetch or (2 * chunk if pickled else 4) * num_workers
        self.chunk = max(1, min(chunk, self.prefetch // (2 * num_workers))) if pickled else 1
        self._done = False
        self._corrupt = 0  # this pass, for the end-of-pass summary
        self._resume: dict | None = None  # the state of a pass shut down with samples in flight

    def reset(self, initial_state: dict | None = None) -> None:
        super().reset(initial_state)
        self.shutdown()
        self.source.reset(initial_state[self.SOURCE_KEY] if initial_state else None)
        self._done = False
        self._corrupt = 0
        self._resume = None

    def next(self) -> dict:
        self._fill()
        if not self._pending:
            self.shutdown()
            raise StopIteration
        _, raw, fut, rows, i = self._pending.popleft()
        fields, bad = fut.result() if i < 0 else fut.result()[i]
        if rows:  # a process wrote these frames into shared rows: use them, nothing was pickled
            fields.update(rows)
        self._fill()
        if not self._pending:
            self.shutdown()  # the last frame is decoded: release the workers now, not at the next call
        out = self._finish(raw, fields, bad)
        if self._done and not self._pending and self._corrupt:
            log.warning("%d corrupt frame(s) skipped this pass (their samples have valid=False); "
                        "re-shard the named shards to recover them", self._corrupt)
            self._corrupt = 0
        return out

    def get_state(self) -> dict[str, Any]:
        # The source is ahead by the frames in flight: resume from the state before the first of them.
        if self._pending or self._calls:
            return {self.SOURCE_KEY: self._pending[0][0] if self._pending else self._calls[0][2][0]}
        if self._resume is not None:
            return {self.SOURCE_KEY: self._resume}
        return {self.SOURCE_KEY: self.source.state_dict()}

    def shutdown(self) -> None:
        """End the pass now: stop the pool (threads joined, processes ended), drop frames in flight, and
        shut the source down. The state still resumes at the first frame not returned; `reset` starts anew."""
        if self._pending or self._calls:
            self._resume = self.get_state()[self.SOURCE_KEY]
        for entry in self._pending:
            entry[2].cancel()
        self._pending.clear()
        self._calls.clear()
        self._done = True
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        if self._slabs is not None:
            self._slabs.unshare()
        shutdown_node(self.source)

    close = shutdown  # the name callers used before torchdata's `shutdown`

    def _fill(self) -> None:
        while not self._done and len(self._pending) + len(self._calls) < self.prefetch:
            before = self.source.state_dict()
            try:
                raw = next(self.source)
            except StopIteration:
                self._done = True
                break
            cams, arrays = self._specs(raw.item.episode)
            if self._pool is None:  # first sample of the pass: workers start now, not at reset
                self._start(cams)
            assert self._pool is not None
            rows, addr, shared = None, None, None
            if self._slabs is not None:
                rows, addr = self._slabs.next_rows(self._shapes(cams))
            if self.method == "process" and addr is not None:
                call: tuple = (decode_shared, (raw.members, cams, self.resize, arrays, addr))
                shared = rows
            elif self.fn is decode_members:
                dest = rows if self.method == "thread" else None
                call = (decode_members, (raw.members, cams, self.resize, arrays, dest))
            else:
                call = (self.fn, (raw.members, cams, self.resize))
            self._calls.append((*call, (before, raw, shared)))
            if len(self._calls) >= self.chunk:
                self._submit()
        if self._calls and (self._done or not self._pending):  # a partial chunk: only when nothing else is coming
            self._submit()

    def _submit(self) -> None:
        """Send the samples read since the last task to the pool: one task for a chunk, or for one sample."""
        assert self._pool is not None
        calls, self._calls = self._calls, []
        if len(calls) == 1 and self.chunk == 1:
            fn, args, (before, raw, shared) = calls[0]
            self._pending.append((before, raw, self._pool.submit(fn, *args), shared, -1))
            return
        fut = self._pool.submit(decode_chunk, [(fn, args) for fn, args, _ in calls])
        for i, (_, _, (before, raw, shared)) in enumerate(calls):
            self._pending.append((before, raw, fut, shared, i))

    def _start(self, cams: dict[str, tuple[int, int]]) -> None:
        if self._slabs is not None and self.method == "process":
            # enough slabs for the frames in flight, the batch being built and two the consumer holds
            self._slabs.share(self._shapes(cams), -(-self.prefetch // self.slab) + 3)
        self._pool = _pool.Pool(self.method, self.num_workers, self.stats)

    def _shapes(self, cams: dict[str, tuple[int, int]]) -> dict[str, tuple[int, int, int]]:
        return {c: (3, *(self.resize or src)) for c, src in cams.items()}

    def _specs(self, episode: str) -> tuple[dict, dict]:
        """Camera source sizes and array (dtype, shape) of an episode, cached for the node's life."""
        if episode not in self._spec_cache:
            ep = self.index.episode(episode)
            self._spec_cache[episode] = ({c: (cam.height, cam.width) for c, cam in ep.cameras.items()},
                                         {k: (a.dtype, a.shape) for k, a in ep.arrays.items()})
        return self._spec_cache[episode]

    def _finish(self, raw: RawSample, fields: dict[str, Any], bad: list[str]) -> dict:
        ep = self.index.episode(raw.item.episode)
        jpegs = getattr(self.fn, "jpegs", None)
        n = jpegs(raw.members, self._specs(ep.id)[0]) if jpegs is not None else len(ep.cameras)
        if raw.damaged is not None:  # the bytes are not the ones written: nothing decoded from them is kept
            _zero(fields, [*ep.cameras, *ep.arrays])
            for k, (dtype, shape) in self._specs(ep.id)[1].items():  # members lost with a damaged header
                fields.setdefault(k, np.zeros(shape, np.dtype(dtype)))
            bad = sorted(ep.cameras)
        else:
            self.stats.add("frames_decoded", n - sum(b in ep.cameras for b in bad))
        valid = raw.item.valid
        if bad:
            reason = raw.damaged or "does not decode to what the index describes"
            where = f"shard {raw.shard} episode {ep.id!r} frame {raw.item.frame} (camera/array {', '.join(bad)})"
            if self.on_corrupt == "raise":
                raise ValueError(f"corrupt data in {where}: {reason}; re-shard it, or pass on_corrupt='skip'")
            log.warning("corrupt data in %s: %s; skipped (valid=False)", where, reason)
            self.stats.add("frames_corrupt", len(bad))
            self._corrupt += len(bad)
            valid = False
        fields.setdefault("timestamp", raw.item.frame / ep.fps)
        fields.update(episode=ep.id, frame=raw.item.frame, valid=valid, prompt=ep.prompt)
        return fields


def _zero(fields: dict[str, Any], keys: list[str]) -> None:
    """Replace the named array fields by zeros of the same shape and dtype (in place where writable:
    a frame in a batch buffer stays where the batch expects it)."""
    for k in keys:
        v = fields.get(k)
        if isinstance(v, np.ndarray):
            if v.flags.writeable:
                v[...] = 0
            else:
                fields[k] = np.zeros_like(v)
        elif hasattr(v, "zero_") and hasattr(v, "clone"):  # a tensor a transform returned
            fields[k] = v.clone().zero_()
