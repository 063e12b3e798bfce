"""The reader protocol: how any dataset layout becomes episodes for the shard writer.

A reader is a small picklable object (it is sent to encoder processes) with two methods::

    class MyReader:
        def episode_ids(self) -> list[str]: ...          # sorted, stable
        def read(self, episode_id: str) -> EpisodeData: ...

`EpisodeData.cameras` maps a camera name to an iterable of HxWx3 uint8 frames, produced
lazily so a long video is never held twice. Frames are RGB unless ``channel_order="bgr"``: a reader
that decodes with OpenCV (or PyAV's ``bgr24``) yields BGR as is, and the JPEG encoder, which wants
BGR, then skips a colour conversion that costs a quarter of the encode. Arrays are per-step:
first dimension = frames.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np


class EpisodeError(ValueError):
    """Bad input in one episode; the message names the episode and the file."""


@dataclass
class EpisodeData:
    id: str
    cameras: dict[str, Iterable[np.ndarray]]
    arrays: dict[str, np.ndarray]
    fps: float
    prompt: str = ""
    split: str | None = None
    # camera/array name -> the name in the source dataset, when it had to be made tar-safe
    sources: dict[str, str] = field(default_factory=dict)
    # camera name -> file it comes from, for error messages
    files: dict[str, str] = field(default_factory=dict)
    channel_order: str = "rgb"  # of every camera's frames: "rgb" or "bgr"


@runtime_checkable
class EpisodeReader(Protocol):
    """What `write_shards` reads: any picklable object with these two methods (no base class needed).

    Register a factory ``root -> reader`` with `register_format` so that `open_reader` and
    ``episodepipes-shard write --format NAME`` find it.
    """

    def episode_ids(self) -> list[str]:
        """Every episode id, in the same order on every call: jobs and resumes count episodes by position."""
        ...

    def read(self, episode_id: str) -> EpisodeData:
        """One episode; raise `EpisodeError` naming the episode and the file when its data is bad.

        Args:
            episode_id: one of `episode_ids`.
        """
        ...
