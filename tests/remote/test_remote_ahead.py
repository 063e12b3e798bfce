"""ReadAhead: the next fetches of a known sequence run in the background; a jump drops the stale ones."""

from __future__ import annotations

import threading

import pytest

from episodepipes.remote.ahead import ReadAhead


def test_the_next_keys_are_fetched_before_they_are_asked_and_each_once():
    asked: list[int] = []
    lock = threading.Lock()
    gate = threading.Event()

    def fetch(k: int) -> int:
        with lock:
            asked.append(k)
        if k > 0:
            gate.wait(5)
        return k * 10

    ahead = ReadAhead(fetch, lambda k: k + 1 if k < 5 else None, depth=2)
    assert ahead.get(0) == 0 and ahead.get(0) == 0  # the current key is kept, not fetched again
    for _ in range(100):
        with lock:
            if sorted(asked) == [0, 1, 2]:
                break
        threading.Event().wait(0.01)
    assert sorted(asked) == [0, 1, 2]  # 1 and 2 were started while 0 was in use
    gate.set()
    assert [ahead.get(k) for k in range(1, 6)] == [10, 20, 30, 40, 50]
    assert sorted(asked) == [0, 1, 2, 3, 4, 5]  # none twice, nothing past the last
    ahead.close()


def test_a_jump_drops_the_fetches_it_made_stale_and_errors_reach_the_key_that_needs_them():
    def fetch(k: int) -> int:
        if k == 7:
            raise OSError("object 7: gone")
        return k

    ahead = ReadAhead(fetch, lambda k: k + 1, depth=3)
    assert ahead.get(0) == 0
    assert ahead.get(5) == 5  # a resume elsewhere: 1..3 are dropped, 6..8 started
    assert set(ahead._pending) == {6, 7, 8}
    assert ahead.get(6) == 6
    with pytest.raises(OSError, match="object 7: gone"):
        ahead.get(7)
    ahead.close()
    assert ahead.get(2) == 2  # usable again after close
    ahead.close()
    with pytest.raises(ValueError, match="depth=-1"):
        ReadAhead(fetch, lambda k: k, depth=-1)
