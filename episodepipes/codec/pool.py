"""`DecoderPool`: the decoders of one camera stream, shared by the decode threads of a process.

Frames of one GOP may reach several threads (the decode stage keeps a GOP in flight on one, `InOrder`'s lanes,
but a history window's GOPs or a GOP met again later go to whichever is least busy), so with one decoder per
thread they would land in several decoders, each decoding the GOP's first packets again. Here a frame goes to the
decoder that holds its GOP: a thread waits while another decodes that GOP (it needs that state anyway), and
otherwise takes an idle decoder, so frames of different GOPs still decode in parallel and each packet of a pass is
decoded once. ``handoffs`` counts the frames a thread took over on a GOP another thread was decoding: each is a
turn the two threads took on one decoder, so the decode stage aims for none.

That holds while the pool has a decoder for every GOP the frames in flight span: a thread that stalls while the
others run ahead finds its GOP's decoder reused for a newer GOP (least recently used first) and decodes the
keyframe again. The default ``limit`` of 8 covers the GOPs 2 threads work on with room (a GOP and the next
one's first frames each, or the few GOPs a task of short ones spans). A decoder whose GOP has given its last
frame (the caller says so: ``last``) is taken first for a new GOP, the most recently used first: a whole-episode
pass then runs on as many decoders as threads, whose buffers are still in cache, instead of cycling through
``limit`` of them.
Otherwise a decoder is made while there are fewer than ``limit``, and past that the least recently used idle one
is taken.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Sequence

import numpy as np

from episodepipes.codec.decode import PacketDecoder


class DecoderPool:
    """Up to ``limit`` `PacketDecoder`s of one stream (codec, extradata, frame size) and the GOP each is on."""

    def __init__(self, codec: str, extradata: bytes = b"", *, size: tuple[int, int] | None = None,
                 limit: int = 8) -> None:
        if limit < 1:
            raise ValueError(f"{limit=} should be >= 1")
        self.codec, self.extradata, self.size, self.limit = codec, extradata, size, limit
        self._cond = threading.Condition()
        self._idle: list[PacketDecoder] = []  # least recently used first
        self._busy: dict[int, Hashable] = {}  # id(decoder) -> the GOP it is decoding
        self._all: list[PacketDecoder] = []
        self._done: set[int] = set()  # id(decoder) whose GOP has given its last frame: free for a new GOP
        self._by: dict[int, tuple[Hashable, int]] = {}  # id(decoder) -> (GOP, thread) of its last frame
        self.handoffs = 0  # frames a thread decoded on the decoder another thread fed their GOP's last frame

    @property
    def decoded(self) -> int:
        """Packets sent to this pool's decoders, over its life (for tests and stats)."""
        return sum(d.decoded for d in self._all)

    def frame(self, gop: Hashable, packets: Sequence[bytes], t: int, *,
              out: np.ndarray | None = None, last: bool = False, tail: int | None = None) -> np.ndarray | None:
        """`PacketDecoder.frame` on the decoder that holds ``gop`` (or a free one), written into ``out`` when it
        fits, else into a new array: never the decoder's own, which goes to the next thread that takes it.

        ``last``: frame ``t`` is its GOP's last, so no later frame of the pass needs the decoder's state.
        ``tail``: the frames a forward reader keeps (`PacketDecoder.frame`).
        """
        dec = self._take(gop)
        me = (gop, threading.get_ident())
        try:
            return dec.frame(gop, packets, t, out=out, tail=tail)
        finally:
            with self._cond:
                was = self._by.get(id(dec), me)
                self.handoffs += was[0] == gop and was[1] != me[1]
                self._by[id(dec)] = me
                del self._busy[id(dec)]
                self._idle.append(dec)
                if last:
                    self._done.add(id(dec))
                self._cond.notify_all()

    def _take(self, gop: Hashable) -> PacketDecoder:
        with self._cond:
            while True:
                # a busy decoder may hold the GOP while it decodes another (it took a done GOP's decoder, and a
                # thread still wants an earlier frame of that GOP): wait for it rather than decode the GOP again
                held = any(id(d) in self._busy and d.holds(gop) for d in self._all)
                if gop not in self._busy.values() and not held:
                    dec = next((d for d in reversed(self._idle) if d.holds(gop)), None)
                    if dec is None:
                        dec = next((d for d in reversed(self._idle) if id(d) in self._done), None)
                    if dec is None and len(self._idle) + len(self._busy) < self.limit:
                        dec = PacketDecoder(self.codec, self.extradata, size=self.size)
                        self._all.append(dec)
                    elif dec is None and self._idle:
                        dec = self._idle[0]
                    if dec is not None:
                        if dec in self._idle:
                            self._idle.remove(dec)
                        self._busy[id(dec)] = gop
                        if not dec.holds(gop):
                            self._done.discard(id(dec))
                        return dec
                self._cond.wait()
