"""The options every pipe builder shares, each defined and checked once.

`DecodeOptions` (workers, method, resize, corrupt-data policy) reaches the `Decoder`; `ReadOptions`
(verify) reaches the shard reader. The builders keep their flat keywords and make these from them.
"""

from __future__ import annotations

from dataclasses import dataclass

METHODS = ("thread", "process")
ON_CORRUPT = ("skip", "raise")


def _positive_int(name: str, v: object) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{name}={v!r} should be an int >= 1")


@dataclass(frozen=True, kw_only=True)
class DecodeOptions:
    """How samples are decoded.

    Attributes:
        num_workers: decode workers (threads or processes), at least 1.
        method: ``"thread"`` (``cv2.imdecode`` releases the GIL) or ``"process"`` (for graphs whose other
            stages hold the GIL).
        resize: ``(H, W)`` every camera is decoded to, or None for the stored size.
        on_corrupt: ``"skip"`` (zeros, ``valid=False``, counted and logged) or ``"raise"``.
    """

    num_workers: int = 2
    method: str = "thread"
    resize: tuple[int, int] | None = None
    on_corrupt: str = "skip"

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"method={self.method!r} should be one of {METHODS}")
        if self.on_corrupt not in ON_CORRUPT:
            raise ValueError(f"on_corrupt={self.on_corrupt!r} should be one of {ON_CORRUPT}")
        if isinstance(self.num_workers, bool) or not isinstance(self.num_workers, int) or self.num_workers < 1:
            raise ValueError(f"num_workers={self.num_workers!r} should be >= 1")
        if self.resize is not None:
            try:
                h, w = self.resize
                _positive_int("resize height", h)
                _positive_int("resize width", w)
            except (TypeError, ValueError):
                raise ValueError(f"resize={self.resize!r} should be (height, width), two ints >= 1, or None") from None
            object.__setattr__(self, "resize", (int(h), int(w)))


@dataclass(frozen=True, kw_only=True)
class ReadOptions:
    """How shards are read by `metric_pipe` and `video_pipe`.

    Attributes:
        verify: check the sha256 of the shards a pass reads, once, before its first byte.
    """

    verify: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.verify, bool):
            raise ValueError(f"verify={self.verify!r} should be True or False")
