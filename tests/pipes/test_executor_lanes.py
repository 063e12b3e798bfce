"""`InOrder` lanes: the calls of a key in flight run on one worker, results still come back in call order, and
the reads reach past the prefetch limit only while fewer keys are in flight than lanes plus the next one."""

from __future__ import annotations

import threading
import time

from episodepipes.pipes._decode.executor import InOrder
from episodepipes.pipes.stats import Stats


def _work(i: int) -> tuple[int, int]:
    time.sleep(0.002)
    return i, threading.get_ident()


def _fill(ex: InOrder, calls: list[tuple[int, str]], limit: int, reach: int) -> int:
    n = 0
    while n < len(calls) and ex.room(limit, reach):
        i, key = calls[n]
        ex.put((i, key), _work, i, key=key)
        n += 1
    return n


def test_a_key_in_flight_stays_on_one_worker_and_results_come_back_in_order():
    calls = [(i, k) for i, k in enumerate("a" * 13 + "b" * 11 + "c" * 13 + "d" * 3 + "e" * 9)]
    ex = InOrder("thread", 2, Stats(), chunk=4, lanes=True)
    got, sent = [], 0
    try:
        while len(got) < len(calls):
            sent += _fill(ex, calls[sent:], 8, 30)
            if ex.idle:
                ex.flush()
            (i, key), (j, thread) = ex.get()
            got.append((i, key, thread))
            assert i == j
    finally:
        ex.close()
    assert [(i, k) for i, k, _ in got] == calls
    threads = {k: {t for _, kk, t in got if kk == k} for k in "abcde"}
    assert all(len(t) == 1 for t in threads.values()), threads
    assert threads["a"] != threads["b"]  # b started while a kept its worker busy: the other one took it


def test_reads_reach_past_the_limit_for_a_gop_per_lane_and_the_next_ones_first_chunk():
    calls = [(i, k) for i, k in enumerate("a" * 10 + "b" * 10 + "c" * 10)]
    ex = InOrder("thread", 2, Stats(), chunk=4, lanes=True)
    try:
        assert _fill(ex, calls, 8, 100) == 24  # a and b whole, then c until its first chunk is sent
        assert _fill(ex, calls[24:], 8, 100) == 0
        ex.get()
        assert _fill(ex, calls[24:], 8, 100) == 0  # three keys still in flight
        assert _fill(ex, calls, 8, 22) == 0 and len(ex) == 23  # and never past the reach
    finally:
        ex.close()
    shared = InOrder("thread", 2, Stats(), chunk=4)  # one shared queue: the limit alone
    try:
        assert _fill(shared, calls, 8, 100) == 8
    finally:
        shared.close()


def test_a_samples_gop_key_is_its_first_video_cameras_gop_id_in_either_layout():
    from episodepipes.codec.pack import pack
    from episodepipes.pipes.frames import JPEG
    from episodepipes.pipes.plan import Item
    from episodepipes.pipes.sample import RawSample, StepWindow
    from episodepipes.pipes.videoframes import Gop, GopKeys, VideoFrames

    keys = GopKeys.of(VideoFrames({"wrist": ("av1", 4), "front": ("h264", 16)}))
    assert GopKeys.of(JPEG) is None and keys.longest == 16
    item = Item("ep0", 5)
    packed = RawSample(item, "s", {"front.h264": Gop(b"sha:100", b"", (b"k", b"p")), "wrist.av1": Gop(b"w", b"", ())})
    members = RawSample(item, "s", {"front.h264": pack([b"sha:200", b"", b"k"]), "state.npy": b"\x93NUMPY"})
    window = RawSample(item, "s", {}, windows={"front": StepWindow((2, 3), (False, False), {
        2: Gop(b"sha:1", b"", (b"k",)), 3: Gop(b"sha:2", b"", (b"k", b"p"))})})
    assert [keys(r) for r in (packed, members, window)] == [b"sha:100", b"sha:200", b"sha:2"]
    assert keys(RawSample(item, "s", {}, damaged="crc32 mismatch")) is None
    assert keys(RawSample(item, "s", {"front.h264": b"EPK1\xff"})) is None  # a damaged pack: the decode says so


def _fails_at(i: int, bad: int) -> int:
    if i == bad:
        raise ValueError(f"call {i}")
    return i * i


def test_a_chunk_hands_out_its_own_results_in_order_and_a_failed_chunk_fails_each_call():
    ex = InOrder("thread", 2, Stats(), chunk=4)
    try:
        for i in range(10):  # chunks [0..3], [4..7] (7 fails), [8, 9]
            ex.put(i, _fails_at, i, 7)
        ex.flush()
        got = [ex.get() for _ in range(4)]
        assert got == [(i, i * i) for i in range(4)]
        for i in range(4, 8):  # the whole failed chunk's calls raise, not the results of the chunk before it
            try:
                ex.get()
            except ValueError as e:
                assert str(e) == "call 7"
            else:
                raise AssertionError(f"call {i} of the failed chunk returned")
        assert [ex.get() for _ in range(2)] == [(8, 64), (9, 81)]
    finally:
        ex.close()
