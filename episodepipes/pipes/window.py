"""History and horizon windows: which steps a training sample returns, which are padding, and their decode.

Convention (LeRobot's ``delta_timestamps``; ACT and Diffusion Policy action chunks): the current step
``t`` is part of both windows, so no key is returned twice.

- ``history={"state": K}``: steps ``t-K+1 .. t``, K steps, the current one last (``[..., -1, :]``);
- ``horizon={"action": H}``: steps ``t .. t+H-1``, H steps, the current one first (``[..., 0, :]``);
- a key in both: steps ``t-K+1 .. t+H-1``, the current one at index ``K-1``.

A windowed key's value gains a step axis (camera ``[W, 3, H, W]``, array ``[W, ...]``). Steps outside
the episode repeat the nearest real step, and ``<key>_pad`` (bool ``[W]``) is True exactly there.

The reader hands a window to a decode worker as one members dict (`window_members`): the current
step's plain fields (``"front.jpg"``, ``"keypoints.npy"``, ``"json"``) for the keys without a window,
``"<key>@<i>"`` for window position ``i``, ``"<key>_pad"`` (one byte per step) and ``"__item__"``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from episodepipes.format import npy_load
from episodepipes.pipes.decode import decode_jpeg, decode_members, load_npy
from episodepipes.pipes.plan import Item

ITEM_KEY = "__item__"
DAMAGED_KEY = "__damaged__"  # present only in a damaged sample: why its bytes are not the ones written


@dataclass(frozen=True)
class Window:
    """Offsets ``first .. last`` (inclusive, ``first <= 0 <= last``) of one key, relative to the current step."""

    key: str
    field: str  # its tar member field: "<camera>.jpg" or "<array>.npy"
    first: int
    last: int

    @property
    def size(self) -> int:
        return self.last - self.first + 1


def _sizes(name: str, spec: Mapping[str, int] | None) -> dict[str, int]:
    if spec is None:
        return {}
    if not isinstance(spec, Mapping):
        raise TypeError(f"{name}={spec!r} should be a dict of key -> number of steps, e.g. {{'state': 2}}")
    for k, n in spec.items():
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"{name}[{k!r}]={n!r} should be a positive int (number of steps, current included)")
    return dict(spec)


def plan_windows(history: Mapping[str, int] | None, horizon: Mapping[str, int] | None, *,
                 cameras: set[str], arrays: set[str]) -> dict[str, Window]:
    """Validate ``history`` / ``horizon`` against the episodes' keys and return one `Window` per key."""
    hist, hor = _sizes("history", history), _sizes("horizon", horizon)
    known = cameras | arrays
    out: dict[str, Window] = {}
    for k in sorted(set(hist) | set(hor)):
        if k not in known:
            raise ValueError(f"window key {k!r} is not a camera or array of these episodes; known: {sorted(known)}")
        if f"{k}_pad" in known:
            raise ValueError(f"window key {k!r}: its mask {k}_pad clashes with a key of the same name; rename it")
        field = f"{k}.jpg" if k in cameras else f"{k}.npy"
        out[k] = Window(k, field, 1 - hist.get(k, 1), hor.get(k, 1) - 1)
    return out


def window_steps(t: int, length: int, w: Window) -> tuple[np.ndarray, np.ndarray]:
    """(steps clamped into the episode, pad mask) of ``w`` around step ``t`` of an episode of ``length``."""
    if not 0 <= t < length:
        raise IndexError(f"step {t} is outside an episode of length {length}")
    raw = np.arange(t + w.first, t + w.last + 1)
    steps = np.clip(raw, 0, length - 1)
    return steps, steps != raw


def fields_by_step(t: int, length: int, windows: Mapping[str, Window]) -> dict[int, set[str]]:
    """The member fields to read at each step other than ``t`` (step ``t`` itself is read whole)."""
    need: dict[int, set[str]] = {}
    for w in windows.values():
        for s in window_steps(t, length, w)[0].tolist():
            if s != t:
                need.setdefault(s, set()).add(w.field)
    return need


def window_members(item: Item, length: int, prompt: str, windows: Mapping[str, Window],
                   read: Mapping[int, Mapping[str, bytes]]) -> dict[str, bytes]:
    """One sample's members for `WindowDecode`, from ``read[step][field]`` (step ``item.frame`` whole)."""
    t = item.frame
    windowed = {w.field for w in windows.values()}
    out = {f: b for f, b in read[t].items() if f not in windowed}
    for w in windows.values():
        steps, pad = window_steps(t, length, w)
        for i, s in enumerate(steps.tolist()):
            out[f"{w.key}@{i}"] = read[s][w.field]  # the same bytes object for repeats: decoded once
        out[f"{w.key}_pad"] = pad.astype(np.uint8).tobytes()
    out[ITEM_KEY] = json.dumps([item.episode, t, item.valid, prompt]).encode()
    return out


def damaged_members(item: Item, length: int, prompt: str, windows: Mapping[str, Window], why: str) -> dict[str, bytes]:
    """The members of a sample whose bytes are damaged: no field data, only its item, pad masks and ``why``."""
    out = {f"{w.key}_pad": window_steps(item.frame, length, w)[1].astype(np.uint8).tobytes() for w in windows.values()}
    out[ITEM_KEY] = json.dumps([item.episode, item.frame, item.valid, prompt]).encode()
    out[DAMAGED_KEY] = why.encode()
    return out


@dataclass(frozen=True)
class WindowDecode:
    """Decode one window sample in a worker, then apply ``transform``; picklable when ``transform`` is.

    Called by `Decoder` as ``fn(members, cameras, resize)`` and returns ``(fields, corrupt cameras)``. A damaged
    sample (`damaged_members`) decodes nothing: every field is zeros of its shape, and every camera is corrupt.
    """

    windows: Mapping[str, Window]
    transform: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    arrays: Mapping[str, tuple[str, tuple[int, ...]]] = field(default_factory=dict)  # key -> (dtype, step shape)

    def __call__(self, members: dict[str, bytes], cameras: dict[str, tuple[int, int]],
                 size: tuple[int, int] | None) -> tuple[dict[str, Any], list[str]]:
        if DAMAGED_KEY in members:
            fields, bad = self._zeros(members, cameras, size), sorted(cameras)
        else:
            fields, bad = self._decode_all(members, cameras, size)
        if ITEM_KEY in members:
            episode, frame, valid, prompt = json.loads(members[ITEM_KEY])
            fields.update(episode=episode, frame=frame, valid=valid, prompt=prompt)
        if self.transform is not None:
            timestamp = fields.get("timestamp")
            fields = self.transform(fields)
            if not isinstance(fields, dict):
                raise TypeError(f"transform={self.transform!r} returned {type(fields).__name__}; it should return "
                                "the sample dict")
            if timestamp is not None:  # restored, as the Decoder restores episode, frame, valid and prompt
                fields["timestamp"] = timestamp
        return fields, bad

    def jpegs(self, members: dict[str, bytes], cameras: dict[str, tuple[int, int]]) -> int:
        """How many JPEGs ``self(members, cameras, ...)`` decodes (for ``stats["frames_decoded"]``): each
        camera without a window once, and each distinct step of a camera window once (a step repeated as
        padding is the same bytes object, decoded once). A damaged sample counts its cameras, all corrupt."""
        if DAMAGED_KEY in members:
            return len(cameras)
        windowed = [k for k in self.windows if k in cameras]
        steps = {id(members[f"{k}@{i}"]) for k in windowed for i in range(self.windows[k].size)}
        return len(cameras) - len(windowed) + len(steps)

    def _decode_all(self, members: dict[str, bytes], cameras: dict[str, tuple[int, int]],
                    size: tuple[int, int] | None) -> tuple[dict[str, Any], list[str]]:
        plain = {k: v for k, v in members.items() if "@" not in k and not k.endswith((".npy", "_pad", ITEM_KEY))}
        fields, bad = decode_members(plain, {c: s for c, s in cameras.items() if c not in self.windows}, size)
        # copies: views of the members are read-only, and a transform may change arrays in place
        fields.update((k[:-4], self._npy(k[:-4], v).copy()) for k, v in members.items()
                      if k.endswith(".npy") and "@" not in k)
        for key, w in self.windows.items():
            done: dict[int, np.ndarray] = {}
            steps = []
            for i in range(w.size):
                data = members[f"{key}@{i}"]
                if id(data) not in done:
                    done[id(data)] = self._decode(key, data, cameras, size, bad)
                steps.append(done[id(data)])
            fields[key] = np.stack(steps)
            fields[f"{key}_pad"] = np.frombuffer(members[f"{key}_pad"], np.uint8).astype(bool)
        return fields, bad

    def _zeros(self, members: dict[str, bytes], cameras: dict[str, tuple[int, int]],
               size: tuple[int, int] | None) -> dict[str, Any]:
        """A damaged sample's fields: zeros of every camera's and array's shape, windows with their step axis."""
        fields: dict[str, Any] = {}
        for key, src in cameras.items():
            fields[key] = np.zeros((3, *(size or src)), np.uint8)
        for key, (dtype, shape) in self.arrays.items():
            fields[key] = np.zeros(shape, np.dtype(dtype).newbyteorder("="))  # as npy_load gives them
        for key, w in self.windows.items():
            fields[key] = np.zeros((w.size, *fields[key].shape), fields[key].dtype)
            fields[f"{key}_pad"] = np.frombuffer(members[f"{key}_pad"], np.uint8).astype(bool)
        return fields

    def _npy(self, key: str, data: bytes) -> np.ndarray:
        """The index gives each array's dtype and shape, so no .npy header is parsed per step."""
        return load_npy(data, *self.arrays[key]) if key in self.arrays else npy_load(data)

    def _decode(self, key: str, data: bytes, cameras: dict[str, tuple[int, int]], size: tuple[int, int] | None,
                bad: list[str]) -> np.ndarray:
        if key not in cameras:
            return self._npy(key, data)
        img = decode_jpeg(data, src=cameras[key], size=size)
        if img is None:
            bad.append(key)
            img = np.zeros((3, *(size or cameras[key])), np.uint8)
        return img
