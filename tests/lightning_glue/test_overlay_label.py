"""The overlay's episode label is drawn whole: never cut at the frame's left (or right) edge."""

import numpy as np
import pytest

from episodepipes.lightning_glue.overlay import draw_overlay, ink_span

GREY = 128


def _label_columns(h, w, episode, frame=12):
    """The columns the label inks in its band at the top of a plain grey frame (nothing else is drawn there)."""
    frames = np.full((1, h, w, 3), GREY, np.uint8)
    draw_overlay(frames, {"episode": [episode], "frame": np.array([frame])}, None)
    band = frames[0, : h // 4 + 12]
    return np.flatnonzero((band != GREY).any(axis=(0, 2)))


@pytest.mark.parametrize(("h", "w", "episode"), [
    (1080, 1920, "jump_0001"),  # 'j' reaches left of the text origin: its descender was cut at column 0
    (2160, 3840, "j"),
    (480, 640, "episode_000003"),
    (96, 128, "episode_000003"),
])
def test_the_label_leaves_the_left_edge_column_blank_and_keeps_all_its_ink(h, w, episode):
    cols = _label_columns(h, w, episode)
    assert cols[0] >= 1, f"the label's ink touches column 0 at {h}x{w}: it is cut at the left edge"
    scale, thick = max(0.3, h / 480), max(1, round(h / 240))
    first, last = ink_span(f"{episode}  f12", scale, thick)  # the label's ink drawn on a canvas with room around it
    assert cols[-1] - cols[0] == last - first  # every inked column is there: nothing was cut
    assert cols[0] <= 6  # still at the top-left, where it always was


@pytest.mark.parametrize(("h", "w"), [(32, 48), (24, 64)])
def test_a_label_wider_than_the_frame_is_drawn_smaller_not_cut_at_the_right_edge(h, w):
    cols = _label_columns(h, w, "episode_000003", frame=123)
    assert cols.size and cols[0] >= 1 and cols[-1] <= w - 2
