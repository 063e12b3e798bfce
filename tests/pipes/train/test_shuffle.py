import pytest

from episodepipes.pipes.order.shuffle import FrameTable
from episodepipes.pipes.plan import Item


def test_frame_table_round_trip():
    t = FrameTable(["a", "b", "c"], [3, 1, 2])
    assert len(t) == 6
    assert [t.item(i) for i in range(6)] == [Item("a", 0), Item("a", 1), Item("a", 2), Item("b", 0), Item("c", 0),
                                             Item("c", 1)]
    with pytest.raises(IndexError, match="6"):
        t.locate(6)


def test_fingerprint_changes_with_the_episodes_their_order_and_lengths():
    fp = FrameTable(["a", "b"], [3, 4]).fingerprint()
    assert fp == FrameTable(["a", "b"], [3, 4]).fingerprint() and len(fp) == 16
    others = [FrameTable(["b", "a"], [4, 3]), FrameTable(["a", "b"], [4, 3]), FrameTable(["a", "c"], [3, 4]),
              FrameTable(["a", "b", "c"], [3, 4, 0]), FrameTable(["ab"], [7])]
    assert len({fp, *(t.fingerprint() for t in others)}) == len(others) + 1
