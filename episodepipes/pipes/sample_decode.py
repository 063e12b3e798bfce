"""The per-sample decode: a `RawSample`'s bytes to the fields of one sample, as a pure function.

`SampleDecode` runs in the decode workers (threads or processes) and returns a `Decoded`: the fields,
which cameras and arrays are corrupt, and how many frames it decoded. It decides nothing about
reporting: the `Decoder` counts, logs or raises in the parent. Camera frames go through a
`FrameDecoder` (JPEG today) into the rows a frame sink handed out, or into fresh arrays. A sample's ``timestamp`` is
made from the index (frame / fps, rounded to the nanosecond as the writer's ``json`` member stores it,
`episodepipes.format.frame_json`): the member is never parsed, a ``json.loads`` a frame that cost more than a
224x224 frame's CRC32.
"""

from __future__ import annotations

import dataclasses
import functools
import io
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from episodepipes.format import npy_header, npy_load
from episodepipes.index import Episode
from episodepipes.pipes._decode.mapped import ShardSlice, Wire, from_wire, resolve
from episodepipes.pipes.frames import JPEG, FrameDecoder
from episodepipes.pipes.sample import RawSample, StepWindow, crc_mismatch

Rows = dict[str, np.ndarray]  # camera -> the [3, H, W] array its frame is decoded into


@dataclass(frozen=True)
class EpisodeSpec:
    """What decoding needs of an episode: camera source sizes, array (dtype, shape), fps and prompt."""

    cameras: dict[str, tuple[int, int]]
    arrays: dict[str, tuple[str, tuple[int, ...]]]
    fps: float
    prompt: str

    @classmethod
    def of(cls, ep: Episode) -> EpisodeSpec:
        return cls({c: (cam.height, cam.width) for c, cam in ep.cameras.items()},
                   {k: (a.dtype, tuple(a.shape)) for k, a in ep.arrays.items()}, ep.fps, ep.prompt)


@dataclass
class Decoded:
    """One sample decoded.

    Attributes:
        fields: key -> value (cameras ``[3, H, W]`` or ``[W, 3, H, W]`` uint8, arrays, ``timestamp``...).
        corrupt: the cameras and arrays that did not decode to what the index describes (zeros instead).
        frames: camera frames decoded (a window step repeated as padding once).
        damaged: why the sample's bytes are not the ones written (``RawSample.damaged``, or a frame of
            ``RawSample.checks`` that failed its crc32 here), or None.
    """

    fields: dict[str, Any]
    corrupt: list[str]
    frames: int
    damaged: str | None = None


@dataclass(frozen=True)
class SampleDecode:
    """Decode one `RawSample`; picklable (for processes) when ``transform`` and ``frames`` are.

    Args:
        resize: (height, width) of every camera frame, or None for the source size.
        frames: the `FrameDecoder` of camera members.
        transform: ``sample -> sample``, run after decoding (train_pipe); ``episode``, ``frame``,
            ``valid``, ``prompt`` and ``timestamp`` are set before it and restored after it.

    A damaged sample (``RawSample.damaged``, or a frame of ``RawSample.checks`` whose bytes fail their
    crc32, checked here so the reading thread does not) decodes nothing: every camera and array is zeros of its
    shape (windows with their step axis) and every camera is corrupt.
    """

    resize: tuple[int, int] | None = None
    frames: FrameDecoder = JPEG
    transform: Callable[[dict[str, Any]], dict[str, Any]] | None = None

    def __call__(self, raw: RawSample | Wire, spec: EpisodeSpec, rows: Rows | None = None) -> Decoded:
        raw = resolved(raw)
        damaged = raw.damaged if raw.damaged is not None else crc_mismatch(raw.checks)
        if damaged is not None:
            out = Decoded(self._zeros(raw, spec, rows), sorted(spec.cameras), 0, damaged)
        else:
            out = self._decode(raw, spec, rows)
        f = out.fields
        f["timestamp"] = round(raw.item.frame / spec.fps, 9)  # what the writer's json member holds (`frame_json`)
        f.update(episode=raw.item.episode, frame=raw.item.frame, valid=raw.item.valid, prompt=spec.prompt)
        if self.transform is not None:
            kept = {k: f[k] for k in ("episode", "frame", "valid", "prompt", "timestamp")}
            f = self.transform(f)
            if not isinstance(f, dict):
                raise TypeError(f"transform={self.transform!r} returned {type(f).__name__}; it should return "
                                "the sample dict")
            f.update(kept)
            if damaged is not None:  # what a transform made of zeros is not data either
                _zero(f, [*spec.cameras, *spec.arrays])
            out.fields = f
        return out

    def _decode(self, raw: RawSample, spec: EpisodeSpec, rows: Rows | None) -> Decoded:
        f: dict[str, Any] = {}
        bad: list[str] = []
        n = 0
        copy = self.transform is not None  # views of the members are read-only; a transform may write
        for cam, src in spec.cameras.items():
            if cam in raw.windows:
                continue
            slot = rows.get(cam) if rows else None
            if cam in raw.borrowed:  # an earlier sample of the batch decodes it; the Decoder copies it in
                f[cam] = slot if slot is not None else np.zeros((3, *(self.resize or src)), np.uint8)
                continue
            data = raw.members.get(self.frames.field(cam))
            img = None if data is None else self.frames.decode(cam, data, src=src, size=self.resize, out=slot)
            if img is None:
                bad.append(cam)
                img = slot if slot is not None else np.empty((3, *(self.resize or src)), np.uint8)
                img[...] = 0
            else:
                n += 1
            f[cam] = img
        arrays = spec.arrays
        for name, data in raw.members.items():
            if name.endswith(".npy"):
                key = name[:-4]
                want = arrays.get(key)
                if want is not None and not copy:  # the usual member: a view of its tail, checked in line
                    dt, head, nbytes = _npy_layout(*want)
                    if dt.isnative and len(data) == len(head) + nbytes and data[:len(head)] == head:
                        f[key] = np.frombuffer(data, dt, offset=len(head)).reshape(want[1])
                        continue
                f[key] = self._array(key, data, spec, bad, copy)
        for key, w in raw.windows.items():
            if key in spec.cameras:
                f[key], k = self._camera_window(key, w, spec.cameras[key], rows.get(key) if rows else None, bad)
                n += k
            else:
                done: dict[int, np.ndarray] = {}  # a step repeated as padding is loaded once
                for s in w.steps:
                    if s not in done:
                        done[s] = self._array(key, w.data[s], spec, bad, False)
                f[key] = np.stack([done[s] for s in w.steps])
            f[f"{key}_pad"] = np.array(w.pad, bool)
        return Decoded(f, bad, n)

    def _camera_window(self, key: str, w: StepWindow, src: tuple[int, int], slot: np.ndarray | None,
                       bad: list[str]) -> tuple[np.ndarray, int]:
        """(a camera window ``[steps, 3, H, W]``, frames decoded): each distinct step decoded once, into
        the window's batch row when it has one; a step repeated as padding is a copy of its first; a
        borrowed step is left for the `Decoder` to copy in."""
        shape = (len(w.steps), 3, *(self.resize or src))
        out = slot if slot is not None and slot.shape == shape else np.empty(shape, np.uint8)
        first: dict[int, int] = {}
        n = 0
        for j, s in enumerate(w.steps):
            if s in w.borrowed:  # an earlier sample of the batch decodes it; the Decoder copies it in
                continue
            if s in first:
                out[j] = out[first[s]]
                continue
            first[s] = j
            row = out[j]
            img = self.frames.decode(key, w.data[s], src=src, size=self.resize, out=row)
            if img is None:
                bad.append(key)
                row[...] = 0
            else:
                n += 1
                if img.ctypes.data != row.ctypes.data:  # a decoder that did not write into the row
                    row[...] = img
        return out, n

    def _array(self, key: str, data: bytes, spec: EpisodeSpec, bad: list[str], copy: bool) -> np.ndarray:
        """An .npy member as the index says it is, or zeros of that dtype and shape (and ``key`` corrupt)."""
        want = spec.arrays.get(key)
        if want is None:
            return npy_load(data)
        try:
            a = load_npy(data, *want)
        except ValueError:
            bad.append(key)
            return np.zeros(want[1], np.dtype(want[0]).newbyteorder("="))
        return a.copy() if copy else a

    def _zeros(self, raw: RawSample, spec: EpisodeSpec, rows: Rows | None) -> dict[str, Any]:
        """A damaged sample's fields: zeros of every camera's and array's shape, windows with their step axis."""
        f: dict[str, Any] = {}
        for cam, src in spec.cameras.items():
            w = raw.windows.get(cam)
            shape = (3, *(self.resize or src)) if w is None else (len(w.steps), 3, *(self.resize or src))
            slot = rows.get(cam) if rows else None
            if slot is not None and slot.shape == shape:
                slot[...] = 0
                f[cam] = slot
            else:
                f[cam] = np.zeros(shape, np.uint8)
        for key, (dtype, shape) in spec.arrays.items():
            w = raw.windows.get(key)
            # native order, as npy_load gives them
            f[key] = np.zeros(shape if w is None else (len(w.steps), *shape), np.dtype(dtype).newbyteorder("="))
        for key, w in raw.windows.items():
            f[f"{key}_pad"] = np.array(w.pad, bool)
        return f


def resolved(raw: RawSample | Wire) -> RawSample:
    """``raw`` with the bytes its `ShardSlice` references name (a decode process's own mappings), or ``raw``
    itself when it holds none; a sample sent as tuples (`to_wire`) comes back a `RawSample`."""
    if type(raw) is tuple:
        return from_wire(raw)
    # a set of the values' types: one C-level pass, not a Python call per member
    if not (_holds_ref(raw.members.values()) or _holds_ref(c[1] for c in raw.checks)
            or raw.windows and any(_holds_ref(w.data.values()) for w in raw.windows.values())):
        return raw

    def get(v: Any) -> Any:
        return resolve(v) if isinstance(v, ShardSlice) else v

    return dataclasses.replace(
        raw, members={k: get(v) for k, v in raw.members.items()},
        windows={k: dataclasses.replace(w, data={s: get(v) for s, v in w.data.items()})
                 for k, w in raw.windows.items()},
        checks=tuple((s, get(d), c) for s, d, c in raw.checks))


def _holds_ref(values: Iterable[Any]) -> bool:
    """Whether any of ``values`` is a `ShardSlice` (a subclass of one too)."""
    return any(issubclass(t, ShardSlice) for t in set(map(type, values)))


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

