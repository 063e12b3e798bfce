"""Camera frames a batch shows more than once are decoded once: later samples borrow them.

Windows overlap: sample ``(e, t)`` with ``history={"front": 2}`` shows front frames ``t-1`` and ``t``, and
another sample of the same batch at ``(e, t-1)`` or ``(e, t+1)`` shows one of them again. `BatchMemo`
runs in the `Decoder`'s thread, beside the samples in submission order (which is the order they are
handed out and stacked): when a sample is sent, each camera frame (episode, step, camera) an earlier
sample of the same batch decodes already is marked borrowed, so the worker leaves it alone; when the
sample is handed out, those frames are copied from the earlier sample's decoded arrays. Validity is per
frame: where the earlier sample did not decode a frame (its own bytes failed their crc32 at another step, or
one of its frames of that camera did not decode), the borrower decodes the frame here from its own bytes
(checked by its own crc32), so a corrupt frame makes only the samples that show it invalid: rare, so the
cost stays off the common path. Batches are counted from the pass's start, as the `BatchStacker` groups them.
A damaged sample (`RawSample.damaged`) lends nothing, and neither does a sample without windows (in a pipe
without windows a frame is in a batch once: an epoch's order holds each frame once; a mixture's source that
starts its order again within a batch has that frame decoded twice, not borrowed).
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from episodepipes.pipes._decode.mapped import ShardSlice, resolve
from episodepipes.pipes.frames import JPEG, FrameDecoder
from episodepipes.pipes.sample import RawSample
from episodepipes.pipes.sample_decode import Decoded

Key = tuple[str, int, str]  # (episode, step, camera)


class BatchMemo:
    """Who decodes each camera frame of a batch, and the decoded frames of the samples handed out of it."""

    def __init__(self, size: int, frames: FrameDecoder = JPEG, resize: tuple[int, int] | None = None) -> None:
        self.size = size
        self._frames, self._resize = frames, resize  # what the workers decode with, for a frame decoded here
        self.start()

    def start(self) -> None:
        """A pass begins: its first sample starts a batch."""
        self._sent = self._out = 0
        self._planned: set[Key] = set()
        self._done: dict[Key, tuple[np.ndarray, bool]] = {}
        # per windowed sample sent, in order: its borrowed frames' own bytes, should their lender not decode them
        self._bytes: deque[dict[Key, Any]] = deque()

    def plan(self, raw: RawSample, cameras: Iterable[str]) -> RawSample:
        """``raw`` with the camera frames an earlier sample of its batch decodes marked borrowed."""
        if self._sent % self.size == 0:
            self._planned = set()
        self._sent += 1
        if raw.damaged is not None or not raw.windows:  # a frame shown without windows is shown once per batch
            return raw
        e, t = raw.item.episode, raw.item.frame
        members = set()
        windows = {}
        own: dict[Key, Any] = {}
        self._bytes.append(own)
        for cam in cameras:
            w = raw.windows.get(cam)
            if w is None:
                if (e, t, cam) in self._planned:
                    members.add(cam)
                    own[(e, t, cam)] = raw.members.get(self._frames.field(cam))
                else:
                    self._planned.add((e, t, cam))
                continue
            steps = set()
            for s in dict.fromkeys(w.steps):
                if (e, s, cam) in self._planned:
                    steps.add(s)
                    own[(e, s, cam)] = w.data.get(s)
                else:
                    self._planned.add((e, s, cam))
            if steps:
                windows[cam] = dataclasses.replace(w, borrowed=frozenset(steps),
                                                   data={s: v for s, v in w.data.items() if s not in steps})
        if not members and not windows:
            return raw
        return dataclasses.replace(raw, borrowed=frozenset(members), windows={**raw.windows, **windows})

    def fill(self, sent: RawSample, decoded: Decoded, cameras: Mapping[str, tuple[int, int]]) -> None:
        """At hand-out, in order: copy ``sent``'s borrowed frames into its decoded fields (decoding here those
        its lender did not decode), then keep this sample's own frames for later ones (as not decoded where
        its bytes failed their crc32 in the worker, or a frame of that camera did not decode).

        Args:
            cameras: camera -> source (height, width), as `EpisodeSpec.cameras`.
        """
        if self._out % self.size == 0:
            self._done = {}
        self._out += 1
        if sent.damaged is not None or not sent.windows:  # nothing borrowed, and nothing planned to lend
            return
        own = self._bytes.popleft()
        fields, corrupt, whole = decoded.fields, decoded.corrupt, decoded.damaged is None
        e, t = sent.item.episode, sent.item.frame
        for cam, src in cameras.items():
            w = sent.windows.get(cam)
            if w is None:
                if cam in sent.borrowed:
                    if whole:
                        self._take((e, t, cam), fields[cam], src, own, decoded)
                else:
                    self._done[(e, t, cam)] = (fields[cam], whole and cam not in corrupt)
                continue
            for j, s in enumerate(w.steps):
                if s in w.borrowed:
                    if whole:
                        self._take((e, s, cam), fields[cam][j], src, own, decoded)
                elif (e, s, cam) not in self._done:
                    self._done[(e, s, cam)] = (fields[cam][j], whole and cam not in corrupt)

    def _take(self, key: Key, into: np.ndarray, src: tuple[int, int], own: dict[Key, Any], decoded: Decoded) -> None:
        """Copy the frame ``key`` from its lender into ``into``, or decode it here from this sample's own bytes
        where the lender did not (a frame that does not decode makes this sample's camera corrupt)."""
        got, ok = self._done[key]
        if ok:
            into[...] = got
            return
        cam, data = key[2], own.get(key)
        if isinstance(data, ShardSlice):
            data = resolve(data)
        img = None if data is None else self._frames.decode(cam, data, src=src, size=self._resize, out=into)
        if img is None:
            into[...] = 0
            if cam not in decoded.corrupt:
                decoded.corrupt.append(cam)
        else:
            decoded.frames += 1
            if img.ctypes.data != into.ctypes.data:  # a decoder that did not write into the row
                into[...] = img
        self._done[key] = (into, img is not None)  # later borrowers copy this one
