"""Camera frames a batch shows more than once are decoded once: later samples borrow them.

Windows overlap: sample ``(e, t)`` with ``history={"front": 2}`` shows front frames ``t-1`` and ``t``, and
another sample of the same batch at ``(e, t-1)`` or ``(e, t+1)`` shows one of them again. `BatchMemo`
runs in the `Decoder`'s thread, beside the samples in submission order (which is the order they are
handed out and stacked): when a sample is sent, each camera frame (episode, step, camera) an earlier
sample of the same batch decodes already is marked borrowed, so the worker leaves it alone; when the
sample is handed out, those frames are copied from the earlier sample's decoded arrays (a frame that
did not decode there is corrupt here too). Batches are counted from the pass's start, as the
`BatchStacker` groups them. A damaged sample (`RawSample.damaged`) lends nothing, and neither does a sample
without windows (in a pipe without windows a frame is in a batch once: an epoch's order holds each frame once;
a mixture's source that starts its order again within a batch has that frame decoded twice, not borrowed).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from episodepipes.pipes.sample import RawSample
from episodepipes.pipes.sample_decode import Decoded

Key = tuple[str, int, str]  # (episode, step, camera)


class BatchMemo:
    """Who decodes each camera frame of a batch, and the decoded frames of the samples handed out of it."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.start()

    def start(self) -> None:
        """A pass begins: its first sample starts a batch."""
        self._sent = self._out = 0
        self._planned: set[Key] = set()
        self._done: dict[Key, tuple[np.ndarray, bool]] = {}

    def plan(self, raw: RawSample, cameras: list[str]) -> RawSample:
        """``raw`` with the camera frames an earlier sample of its batch decodes marked borrowed."""
        if self._sent % self.size == 0:
            self._planned = set()
        self._sent += 1
        if raw.damaged is not None or not raw.windows:  # a frame shown without windows is shown once per batch
            return raw
        e, t = raw.item.episode, raw.item.frame
        members = set()
        windows = {}
        for cam in cameras:
            w = raw.windows.get(cam)
            if w is None:
                if (e, t, cam) in self._planned:
                    members.add(cam)
                else:
                    self._planned.add((e, t, cam))
                continue
            steps = set()
            for s in dict.fromkeys(w.steps):
                if (e, s, cam) in self._planned:
                    steps.add(s)
                else:
                    self._planned.add((e, s, cam))
            if steps:
                windows[cam] = dataclasses.replace(w, borrowed=frozenset(steps),
                                                   data={s: v for s, v in w.data.items() if s not in steps})
        if not members and not windows:
            return raw
        return dataclasses.replace(raw, borrowed=frozenset(members), windows={**raw.windows, **windows})

    def fill(self, sent: RawSample, decoded: Decoded, cameras: list[str]) -> None:
        """At hand-out, in order: copy ``sent``'s borrowed frames into its decoded fields (a borrowed frame
        that was corrupt makes its camera corrupt here too), then keep this sample's own frames for later ones
        (as corrupt where its bytes failed their crc32 in the worker)."""
        if self._out % self.size == 0:
            self._done = {}
        self._out += 1
        if sent.damaged is not None or not sent.windows:  # nothing borrowed, and nothing planned to lend
            return
        fields, corrupt, whole = decoded.fields, decoded.corrupt, decoded.damaged is None
        e, t = sent.item.episode, sent.item.frame
        for cam in cameras:
            w = sent.windows.get(cam)
            if w is None:
                if cam in sent.borrowed:
                    if whole:
                        self._take((e, t, cam), fields[cam], cam, corrupt)
                else:
                    self._done[(e, t, cam)] = (fields[cam], whole and cam not in corrupt)
                continue
            for j, s in enumerate(w.steps):
                if s in w.borrowed:
                    if whole:
                        self._take((e, s, cam), fields[cam][j], cam, corrupt)
                elif (e, s, cam) not in self._done:
                    self._done[(e, s, cam)] = (fields[cam][j], whole and cam not in corrupt)

    def _take(self, key: Key, into: np.ndarray, cam: str, corrupt: list[str]) -> None:
        src, ok = self._done[key]
        into[...] = src
        if not ok and cam not in corrupt:
            corrupt.append(cam)
