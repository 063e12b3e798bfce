"""Handing written videos to the trainer's loggers, in a background thread, off the render pass's clock.

Why a thread: under DDP the other ranks wait for rank 0 in their next collective for as long as rank 0
works outside one, and ``pg_timeout`` bounds that wait. Uploads (a GIF for TensorBoard, a file for W&B)
are not needed for the next training step, so rank 0 starts them and trains on; the thread runs
alongside, and `Uploader.join` waits for it at teardown, so no upload is lost and failures are logged
with the file they concern.

TensorBoard: torch's ``add_video`` needs moviepy<2, whose GIF played at the wrong rate and showed fewer
frames than the video had (64 of 70, 116 of 160). Here the GIF is encoded with PyAV from the mp4 that was
just written, one GIF frame per video frame, each at its exact presentation time in centiseconds (delays alternate,
e.g. 13 and 14 cs for 7.5 fps, so the average rate is the source rate). A GIF cannot be faster than
50 fps (browsers slow delays under 2 cs down), so above that it plays slower than the source; the mp4
on disk keeps the exact rate.

W&B (and any logger with a public ``log_video(key, videos, step=None, **kwargs)``): the file path is passed
with ``format=["mp4"]`` and no ``fps``: for a file the rate is the file's own, and ``wandb.Video`` warns
about an ``fps`` it ignores.
"""

from __future__ import annotations

import io
import logging
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from fractions import Fraction
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import Logger, TensorBoardLogger

log = logging.getLogger(__name__)


def can_take_video(logger: Logger) -> bool:
    """TensorBoard (a GIF), or a logger with a public ``log_video`` method (W&B's `WandbLogger`)."""
    return isinstance(logger, TensorBoardLogger) or callable(getattr(logger, "log_video", None))


def _class_names(logger: Logger) -> set[str]:
    return {c.__name__ for c in type(logger).__mro__}


def choose_loggers(loggers: Sequence[Logger], log_to: str | Sequence[str] | None) -> list[Logger]:
    """The trainer's loggers that receive videos, for `OverlayVideoWriter`'s ``log_to``; raises if one is unusable."""
    if log_to is None:
        return []
    if log_to == "auto":
        return [lg for lg in loggers if can_take_video(lg)]
    if isinstance(log_to, str) or not all(isinstance(n, str) for n in log_to):
        raise ValueError(f"log_to={log_to!r} should be 'auto', None, or a list of logger class names such as "
                         "['WandbLogger'] or ['TensorBoardLogger']")
    chosen = []
    for name in log_to:
        match = [lg for lg in loggers if name in _class_names(lg)]
        if not match:
            raise ValueError(f"log_to names {name!r}, but the trainer's loggers are "
                             f"{[type(lg).__name__ for lg in loggers]}; add it to Trainer(logger=...) or drop it")
        for lg in match:
            if not can_take_video(lg):
                raise ValueError(f"log_to names {name!r}, which cannot take a video (neither TensorBoard nor a "
                                 "logger with log_video); drop it from log_to")
            if lg not in chosen:
                chosen.append(lg)
    return chosen


def gif_from_mp4(path: str | Path, fps: float) -> tuple[bytes, int, int]:
    """Encode the video at ``path`` as a GIF with one frame per video frame at exact centisecond times.

    Returns ``(gif_bytes, height, width)``.
    """
    import av

    buf = io.BytesIO()
    with av.open(str(path)) as src, av.open(buf, "w", format="gif") as out:
        vin = src.streams.video[0]
        stream = out.add_stream("gif", rate=Fraction(fps).limit_denominator(1_000_000))
        stream.width, stream.height, stream.pix_fmt = vin.codec_context.width, vin.codec_context.height, "rgb8"
        stream.codec_context.time_base = Fraction(1, 100)
        last = -1
        for i, frame in enumerate(src.decode(vin)):
            pts = max(round(i * 100 / fps), last + 2)  # whole centiseconds, at least 2 apart (browsers)
            g = frame.reformat(format="rgb8")
            g.pts, g.time_base, last = pts, Fraction(1, 100), pts
            out.mux(stream.encode(g))
        out.mux(stream.encode())
        h, w = stream.height, stream.width
    return buf.getvalue(), h, w


def to_tensorboard(logger: TensorBoardLogger, tag: str, path: Path, fps: float, step: int) -> None:
    """Log ``path`` as an animated GIF image summary (what TensorBoard's "Images" tab plays)."""
    from tensorboard.compat.proto.summary_pb2 import Summary

    gif, h, w = gif_from_mp4(path, fps)
    summary = Summary(value=[Summary.Value(tag=tag, image=Summary.Image(height=h, width=w, colorspace=3,
                                                                        encoded_image_string=gif))])
    logger.experiment.file_writer.add_summary(summary, step)


def to_logger(logger: Logger, tag: str, path: Path, fps: float, step: int) -> None:
    """Hand one video file to one logger."""
    if isinstance(logger, TensorBoardLogger):
        to_tensorboard(logger, tag, path, fps, step)
    else:  # WandbLogger.log_video(key, videos, step=None, **kwargs): kwargs are per-video lists
        logger.log_video(tag, videos=[str(path)], step=step, format=["mp4"])


class Uploader:
    """One background thread that hands videos to loggers in order; `join` waits for all and logs failures."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._pending: list[tuple[Path, Future]] = []
        self.seconds = 0.0  # time spent in uploads so far (in the background thread)

    def submit(self, loggers: Sequence[Logger], tag: str, path: Path, fps: float, step: int) -> None:
        if not loggers:
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="episodepipes-video-upload")
        self._pending.append((path, self._pool.submit(self._run, list(loggers), tag, path, fps, step)))

    def _run(self, loggers: list[Logger], tag: str, path: Path, fps: float, step: int) -> None:
        t0 = time.perf_counter()
        for lg in loggers:
            to_logger(lg, tag, path, fps, step)
        dt = time.perf_counter() - t0
        self.seconds += dt
        log.info("logged %s to %s in %.2f s (background)", path.name, [type(lg).__name__ for lg in loggers], dt)

    def join(self) -> list[tuple[Path, BaseException]]:
        """Wait for every upload; returns (and logs) the ones that failed. The files stay on disk either way."""
        failed = []
        for path, fut in self._pending:
            err: Any = fut.exception()
            if err is not None:
                failed.append((path, err))
                log.error("could not log video %s to the loggers (%s: %s); the file is kept", path,
                          type(err).__name__, err)
        self._pending = []
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        return failed
