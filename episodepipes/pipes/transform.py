"""`sample_transform`: a builder's ``transform=``, checked once when the pipe is built, for every builder alike.

The transform runs per sample in the decode workers (`SampleDecode`), before collation. Checking it here,
and not at the first batch, keeps a bad one from costing a worker start (a closed video gate starts none),
and the errors name the pipe it was given to.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Transform = Callable[[dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True)
class SampleTransform:
    """``fn`` that refuses, naming ``pipe``, anything but a dict as a result; picklable when ``fn`` is."""

    fn: Transform
    pipe: str

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        out = self.fn(sample)
        if not isinstance(out, dict):
            raise TypeError(f"{self.pipe}: transform={self.fn!r} returned {type(out).__name__}; it should return "
                            "the sample dict (return the dict it was given, changed, or a new one)")
        return out


def sample_transform(transform: Transform | None, *, method: str, pipe: str) -> SampleTransform | None:
    """``transform`` wrapped for the decode workers, or None; refused now if it cannot run there.

    Args:
        transform: ``transform(sample) -> sample``, or None for no transform.
        method: the decode method; with ``"process"`` the transform must pickle.
        pipe: the builder's name (``"metric_pipe"``...), for the messages.
    """
    if transform is None:
        return None
    if not callable(transform):
        raise TypeError(f"{pipe}: transform={transform!r} should be a callable taking and returning a sample dict")
    if method == "process":
        try:
            pickle.dumps(transform)
        except Exception as e:  # any failure to pickle means it cannot reach a process worker
            raise TypeError(f"{pipe}: transform={transform!r} does not pickle ({e}); with method='process' use a "
                            "module-level function or a picklable callable object, or method='thread'") from None
    return SampleTransform(transform, pipe)
