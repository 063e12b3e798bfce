import numpy as np
import pytest

from episodepipes.codec import Packets


@pytest.mark.parametrize(("kw", "match"), [
    ({"codec": "mpeg4"}, "codec="), ({"height": 0}, "0x16"), ({"width": 10 ** 6}, "16x1000000"),
    ({"key": np.array([0, 0, 1])}, "keyframe"), ({"key": np.array([1, 1, 2])}, "keyframe"),
    ({"key": np.array([0, 0])}, "key.shape"), ({"lead": 4}, "lead=4"),
])
def test_packets_that_do_not_add_up_are_refused(kw, match):
    args = {"codec": "h264", "extradata": b"", "height": 16, "width": 16, "data": [b"a", b"b", b"c"],
            "key": np.array([0, 0, 2]), "lead": 0} | kw
    with pytest.raises(ValueError, match=match):
        Packets(**args)


def test_frames_count_after_the_leading_packets_and_know_their_keyframe():
    p = Packets("av1", b"", 16, 16, [b"k", b"p", b"k", b"p", b"p"], np.array([0, 0, 2, 2, 2]), lead=1)
    assert len(p) == 4 and [p.keyframe_of(t) for t in range(4)] == [0, 2, 2, 2] and p.max_gop() == 3
