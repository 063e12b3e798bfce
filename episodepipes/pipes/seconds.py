"""Windows in seconds: LeRobot's ``delta_timestamps`` turned into the steps of ``history=`` / ``horizon=``.

``delta_timestamps={key: [offsets in seconds]}`` is LeRobot's way to ask for a window: ``[-0.1, 0.0]`` at 10 fps
is the previous and the current step. The conversion is LeRobot's (``check_delta_timestamps`` and
``get_delta_indices``): an offset ``d`` is step ``round(d * fps)``, and it must lie within ``tolerance_s`` seconds
of that step (``abs(d * fps - round(d * fps)) / fps <= tolerance_s``, 1e-4 s by default, LeRobot's default), else
it is refused naming the key, the offset and the fps.

A pipe's windows are runs of consecutive steps through the current one (`episodepipes.pipes.order.window`), so the
steps of a key must be consecutive and ascending: ``[-0.1, 0.0]`` is ``history={key: 2}``, ``[0.0, 0.1, ..., 1.5]``
is ``horizon={key: 16}`` and ``[-0.1, 0.0, ..., 1.4]`` both. A run that does not reach the current step
(``[0.1, 0.2]``, ``[-0.3, -0.2]``) is read as the run from or to it, and the steps between are dropped from the
batch (`SecondsWindows.trim`); they cost reads (and a camera's decodes), so a warning names a key whose dropped
steps outnumber the steps asked for. Other offsets (a stride,
a gap, a repeat, another order) are refused with the steps they give. Steps depend on the fps, so every episode of
the pipe must give each key the same steps (episodes of different fps are refused naming two of them).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from numbers import Real

from episodepipes.index import Episode

log = logging.getLogger(__name__)

DEFAULT_TOLERANCE_S = 1e-4  # LeRobotDataset's
MAX_OFFSETS = 100_000


def check_tolerance(tolerance_s: object) -> float:
    """``tolerance_s`` as a float if it is a finite number of seconds > 0, else a ValueError."""
    if isinstance(tolerance_s, bool) or not isinstance(tolerance_s, Real) or not math.isfinite(tolerance_s) \
            or tolerance_s <= 0:
        raise ValueError(f"tolerance_s={tolerance_s!r} should be a finite number of seconds > 0 (LeRobot's "
                         f"default is {DEFAULT_TOLERANCE_S})")
    return float(tolerance_s)


def delta_steps(delta_timestamps: Mapping[str, Sequence[float]], fps: float,
                tolerance_s: float = DEFAULT_TOLERANCE_S) -> dict[str, list[int]]:
    """``{key: [step offsets]}`` of ``{key: [offsets in seconds]}`` at ``fps``, by LeRobot's tolerance rule.

    Args:
        delta_timestamps: per key, a non-empty list of finite offsets in seconds from the current step.
        fps: the episodes' frames per second.
        tolerance_s: how far from a step (in seconds) an offset may lie, > 0.

    >>> delta_steps({"action": [0.0, 0.1, 0.2]}, 10)
    {'action': [0, 1, 2]}
    """
    tol = check_tolerance(tolerance_s)
    if not isinstance(delta_timestamps, Mapping):
        raise TypeError(f"delta_timestamps={delta_timestamps!r} should be a dict of key -> list of offsets in "
                        "seconds, e.g. {'action': [0.0, 0.1, 0.2]}")
    out: dict[str, list[int]] = {}
    for key, offsets in delta_timestamps.items():
        at = f"delta_timestamps[{key!r}]"
        if isinstance(offsets, str | bytes) or not isinstance(offsets, Sequence) or not 0 < len(offsets) \
                <= MAX_OFFSETS:
            raise ValueError(f"{at}={offsets!r} should be a non-empty list of offsets in seconds (at most "
                             f"{MAX_OFFSETS}), e.g. [-0.1, 0.0]")
        steps = []
        for d in offsets:
            if isinstance(d, bool) or not isinstance(d, Real) or not math.isfinite(d):
                raise ValueError(f"{at} holds {d!r}; offsets are finite numbers of seconds")
            x = float(d) * fps
            if abs(x - round(x)) / fps > tol:
                raise ValueError(f"{at}: offset {d!r} s is {x:.6g} steps at {fps:g} fps, more than tolerance_s="
                                 f"{tol:g} s from a step; use multiples of 1/{fps:g} s, or pass a larger tolerance_s")
            steps.append(round(x))
        out[key] = steps
    return out


@dataclass(frozen=True)
class SecondsWindows:
    """A pipe's windows in steps, with what `delta_timestamps` asked for.

    Attributes:
        history: ``{key: K}`` for `plan_windows`, or None.
        horizon: ``{key: H}``, or None.
        trim: ``{key: (front, back)}``: steps to drop from the front and the back of the key's window (and its
            mask) in each batch, where the steps asked for do not reach the current step.
    """

    history: dict[str, int] | None
    horizon: dict[str, int] | None
    trim: dict[str, tuple[int, int]] = field(default_factory=dict)


def step_windows(steps: Mapping[str, Sequence[int]]) -> SecondsWindows:
    """The windows of `delta_steps`' output; steps that are not a consecutive ascending run are refused, naming
    the key and its steps. A run that misses step 0 is widened to it, and the widening put in ``trim``."""
    history, horizon, trim = {}, {}, {}
    for key, s in steps.items():
        lo, hi = min(s), max(s)
        if list(s) != list(range(lo, hi + 1)):
            raise ValueError(f"delta_timestamps[{key!r}] gives steps {list(s)[:20]}; a window is consecutive steps in "
                             "ascending order, e.g. [-0.1, 0.0] or [0.0, 0.1, 0.2] at 10 fps; ask for the run of "
                             "steps and slice the batch")
        if lo > 0 or hi < 0:
            trim[key] = (max(lo, 0), max(-hi, 0))
            lo, hi = min(lo, 0), max(hi, 0)
        if lo < 0:
            history[key] = 1 - lo
        if hi > 0:
            horizon[key] = hi + 1
        if lo == hi == 0:
            history[key] = 1  # the current step alone, with a step axis, as LeRobot gives it
    return SecondsWindows(history, horizon, trim)


def seconds_windows(delta_timestamps: Mapping[str, Sequence[float]] | None, episodes: Sequence[Episode], *,
                    tolerance_s: float, history: Mapping[str, int] | None, horizon: Mapping[str, int] | None,
                    keys: Mapping[str, str] | None = None) -> SecondsWindows:
    """``history`` and ``horizon`` with ``delta_timestamps`` (converted at the episodes' fps) added to them.

    Args:
        delta_timestamps: LeRobot's ``{key: [offsets in seconds]}``, or None.
        episodes: the pipe's episodes; their fps must give every key the same steps.
        tolerance_s: LeRobot's tolerance in seconds.
        history: ``{key: K}`` in steps, or None; a key in both it (or ``horizon``) and ``delta_timestamps`` is refused.
        horizon: ``{key: H}`` in steps, or None.
        keys: maps a key of any of the three to the index key it means (a LeRobot name to the tar-safe one);
            None keeps keys as given.
    """
    keys = keys or {}
    hist = None if history is None else _resolved("history", _mapping("history", history), keys)
    hor = None if horizon is None else _resolved("horizon", _mapping("horizon", horizon), keys)
    if delta_timestamps is None:
        check_tolerance(tolerance_s)
        return SecondsWindows(hist, hor)
    steps: dict[str, list[int]] | None = None
    by: Episode | None = None
    for e in episodes:
        if by is not None and e.fps == by.fps:
            continue
        got = delta_steps(delta_timestamps, e.fps, tolerance_s)
        if steps is not None and got != steps and by is not None:
            raise ValueError(f"delta_timestamps give other steps in episode {e.id!r} ({e.fps:g} fps) than in "
                             f"{by.id!r} ({by.fps:g} fps); pipe episodes of one fps, or give windows in steps "
                             "(history=/horizon=)")
        steps, by = got, e
    if steps is None:
        return SecondsWindows(hist, hor)
    asked = _resolved("delta_timestamps", steps, keys)
    got = step_windows(asked)
    for k, (front, back) in got.trim.items():
        if front + back > len(asked[k]):
            log.warning("delta_timestamps[%r] gives steps %d..%d: the %d steps between them and the current one are "
                        "read too, then dropped", k, min(asked[k]), max(asked[k]), front + back)
    for k in {*got.history, *got.horizon}:
        if k in (hist or {}) or k in (hor or {}):
            raise ValueError(f"window key {k!r} is in delta_timestamps and in history=/horizon=; give it once")
    return SecondsWindows({**(hist or {}), **got.history} or None, {**(hor or {}), **got.horizon} or None, got.trim)


def _resolved(name: str, spec: Mapping, keys: Mapping[str, str]) -> dict:
    """``spec`` keyed by index keys; two keys meaning one index key are refused."""
    out: dict = {}
    for k, v in spec.items():
        key = keys.get(k, k)
        if key in out:
            raise ValueError(f"{name} names index key {key!r} twice (as its own name and its source name); give it "
                             "once")
        out[key] = v
    return out


def _mapping(name: str, spec: object) -> Mapping:
    if not isinstance(spec, Mapping):
        raise TypeError(f"{name}={spec!r} should be a dict of key -> number of steps, e.g. {{'state': 2}}")
    return spec
