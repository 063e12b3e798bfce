"""History and horizon windows: which steps a training sample returns and which are padding.

Convention (LeRobot's ``delta_timestamps``; ACT and Diffusion Policy action chunks): the current step
``t`` is part of both windows, so no key is returned twice.

- ``history={"state": K}``: steps ``t-K+1 .. t``, K steps, the current one last (``[..., -1, :]``);
- ``horizon={"action": H}``: steps ``t .. t+H-1``, H steps, the current one first (``[..., 0, :]``);
- a key in both: steps ``t-K+1 .. t+H-1``, the current one at index ``K-1``.

A windowed key's value gains a step axis (camera ``[W, 3, H, W]``, array ``[W, ...]``). Steps outside
the episode repeat the nearest real step, and ``<key>_pad`` (bool ``[W]``) is True exactly there.
The reader hands a window sample over as a `RawSample` whose ``windows`` hold each windowed key's
`StepWindow` (`window_sample`); `SampleDecode` decodes it.

A planned pass (metric_pipe, video_pipe: items in a fixed order) reads each step a window shows once:
`window_reads` lists the steps to read in plan order, and `window_samples` assembles each item's sample
from them, holding a step only until the last item that shows it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from episodepipes.pipes.plan import Item
from episodepipes.pipes.sample import RawSample, StepWindow, crc_mismatch


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


def video_fields(windows: Mapping[str, Window], video: Mapping[str, tuple[str, int]]) -> dict[str, Window]:
    """``windows`` with each video camera's field (``video``: camera -> (codec, gop)) its video member,
    ``<camera>.<codec>``, instead of ``.jpg``: a window step's bytes are then its GOP up to that step."""
    return {k: replace(w, field=f"{k}.{video[k][0]}") if k in video else w for k, w in windows.items()}


def window_steps(t: int, length: int, w: Window) -> tuple[np.ndarray, np.ndarray]:
    """(steps clamped into the episode, pad mask) of ``w`` around step ``t`` of an episode of ``length``."""
    steps, pad = _steps(t, length, w)
    return np.array(steps, np.int64), np.array(pad, bool)


def _steps(t: int, length: int, w: Window) -> tuple[tuple[int, ...], tuple[bool, ...]]:
    """`window_steps` as tuples of Python ints: the reader calls it per sample and window, and numpy's
    per-call cost on a few elements is most of the reader's time."""
    if not 0 <= t < length:
        raise IndexError(f"step {t} is outside an episode of length {length}")
    last = length - 1
    raw = range(t + w.first, t + w.last + 1)
    steps = tuple(0 if s < 0 else last if s > last else s for s in raw)
    return steps, tuple(s != r for s, r in zip(steps, raw))


def fields_by_step(t: int, length: int, windows: Mapping[str, Window]) -> dict[int, set[str]]:
    """The member fields to read at each step other than ``t`` (step ``t`` itself is read whole)."""
    need: dict[int, set[str]] = {}
    for w in windows.values():
        for s in _steps(t, length, w)[0]:
            if s != t:
                need.setdefault(s, set()).add(w.field)
    return need


def window_sample(item: Item, shard: str, length: int, windows: Mapping[str, Window],
                  read: Mapping[int, Mapping[str, bytes]]) -> RawSample:
    """One training sample from ``read[step][field]`` (step ``item.frame`` read whole)."""
    t = item.frame
    if not windows:  # the current step's members are the sample's, as they were read
        return RawSample(item, shard, dict(read[t]))
    windowed = {w.field for w in windows.values()}
    members = {f: b for f, b in read[t].items() if f not in windowed}
    out = {}
    for w in windows.values():
        st, pad = _steps(t, length, w)
        out[w.key] = StepWindow(st, pad, {s: read[s][w.field] for s in set(st)})
    return RawSample(item, shard, members, windows=out)


def damaged_sample(item: Item, shard: str, length: int, windows: Mapping[str, Window], why: str) -> RawSample:
    """A sample whose bytes are damaged: no member data, only its item, its windows' steps and ``why``."""
    out = {}
    for w in windows.values():
        out[w.key] = StepWindow(*_steps(item.frame, length, w))
    return RawSample(item, shard, {}, damaged=why, windows=out)


@dataclass(frozen=True)
class WindowReads:
    """The steps a planned pass of window samples reads, each once while some item shows it.

    Attributes:
        reads: the steps to read, as items, in plan order (each item's steps ascending, so runs stay contiguous).
        upto: per planned item, how many of ``reads`` are read before its sample is assembled.
        last: per read, the planned item after which it is dropped (the last one that shows it).
    """

    reads: list[Item]
    upto: list[int]
    last: list[int]


def window_reads(items: Sequence[Item], lengths: Mapping[str, int], windows: Mapping[str, Window]) -> WindowReads:
    """Which steps to read for ``items`` (``lengths``: episode id -> frames), a step shown again read once."""
    reads: list[Item] = []
    upto: list[int] = []
    last: list[int] = []
    at: dict[tuple[str, int], int] = {}  # (episode, step) -> its position in reads
    for i, it in enumerate(items):
        for s in sorted({it.frame, *fields_by_step(it.frame, lengths[it.episode], windows)}):
            k = at.get((it.episode, s))
            if k is None:
                at[it.episode, s] = len(reads)
                reads.append(Item(it.episode, s))
                last.append(i)
            else:
                last[k] = i
        upto.append(len(reads))
    return WindowReads(reads, upto, last)


def window_samples(items: Sequence[Item], plan: WindowReads, raws: Iterator[RawSample], lengths: Mapping[str, int],
                   windows: Mapping[str, Window]) -> Iterator[RawSample]:
    """Each planned item's window sample, from ``raws`` (the samples of ``plan.reads``, in order).

    A sample is damaged when any step it shows is (`damaged_sample`). Each step's crc32 (`RawSample.checks`) is
    checked here, once, not in the decode worker: the `Decoder`'s `BatchMemo` decides which sample decodes a frame
    the batch shows twice before the workers run, and must not pick one whose bytes turn out damaged there (its
    borrowers would get zeros, and theirs in turn).
    """
    drop: dict[int, list[tuple[str, int]]] = {}
    for r, i in zip(plan.reads, plan.last):
        drop.setdefault(i, []).append((r.episode, r.frame))
    held: dict[tuple[str, int], RawSample] = {}
    taken = 0
    for i, item in enumerate(items):
        while taken < plan.upto[i]:
            raw = next(raws)
            if raw.checks:
                raw.damaged, raw.checks = raw.damaged or crc_mismatch(raw.checks), ()
            held[raw.item.episode, raw.item.frame] = raw
            taken += 1
        n = lengths[item.episode]
        got = {s: held[item.episode, s] for s in (item.frame, *fields_by_step(item.frame, n, windows))}
        own = got[item.frame]
        why = next((r.damaged for r in got.values() if r.damaged is not None), None)
        if why is not None:
            yield damaged_sample(item, own.shard, n, windows, why)
        else:
            yield window_sample(item, own.shard, n, windows, {s: r.members for s, r in got.items()})
        for key in drop.pop(i, ()):
            del held[key]
