"""delta_timestamps -> steps (LeRobot's tolerance rule), and the source-name checks, as plain functions."""

from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from episodepipes.pipes.names import lerobot_keys, source_names, window_keys
from episodepipes.pipes.seconds import delta_steps, seconds_windows, step_windows


@given(st.lists(st.integers(-300, 300), min_size=1, max_size=8), st.sampled_from([10, 15, 30, 50, 29.97]),
       st.floats(-0.9, 0.9))
def test_an_offset_within_tolerance_of_a_step_is_that_step_and_one_past_it_is_refused(steps, fps, frac):
    tol = 1e-4
    near = [k / fps + frac * tol for k in steps]
    assert delta_steps({"a": near}, fps, tol) == {"a": steps}
    far = [k / fps + (1.2 if frac >= 0 else -1.2) * tol for k in steps]
    with pytest.raises(ValueError, match=r"delta_timestamps\['a'\]: offset .* more than tolerance_s=0.0001 s"):
        delta_steps({"a": far}, fps, tol)


def test_steps_become_history_and_horizon_and_other_runs_are_refused():
    got = step_windows({"img": [-1, 0], "act": [0, 1, 2], "s": [-2, -1, 0, 1], "now": [0]})
    assert (got.history, got.horizon, got.trim) == ({"img": 2, "s": 3, "now": 1}, {"act": 3, "s": 2}, {})
    for bad in ([-2, 0], [0, -1], [0, 0], [2, 1], [0, 2, 4]):
        with pytest.raises(ValueError, match=rf"gives steps \[{', '.join(map(str, bad))}\]; a window is consecutive"):
            step_windows({"k": bad})


def test_a_run_short_of_the_current_step_is_widened_to_it_and_the_widening_trimmed():
    got = step_windows({"future": [2, 3], "past": [-3, -2, -1], "next": [1]})
    assert got.history == {"past": 4} and got.horizon == {"future": 4, "next": 2}
    assert got.trim == {"future": (2, 0), "past": (0, 1), "next": (1, 0)}


@pytest.mark.parametrize(("spec", "why"), [
    ([], "should be a non-empty list"), ("0.1", "should be a non-empty list"), ([0.0, float("nan")], "holds nan"),
    ([True], "holds True"), ([0.0, "0.1"], "holds '0.1'"),
])
def test_offsets_that_are_not_finite_numbers_are_refused(spec, why):
    with pytest.raises(ValueError, match=why):
        delta_steps({"k": spec}, 10)


@pytest.mark.parametrize("tol", [0, -1e-4, float("inf"), float("nan"), True, "1e-4"])
def test_a_tolerance_that_is_not_a_positive_finite_number_is_refused(tol):
    with pytest.raises(ValueError, match="tolerance_s=.* should be a finite number of seconds > 0"):
        delta_steps({"k": [0.0]}, 10, tol)


def _ep(eid, fps):
    return SimpleNamespace(id=eid, fps=fps)


def test_episodes_whose_fps_give_other_steps_are_refused_naming_two_and_equal_steps_pass():
    eps = [_ep("a", 10.0), _ep("b", 10.0), _ep("c", 20.0)]
    with pytest.raises(ValueError, match=r"other steps in episode 'c' \(20 fps\) than in 'a' \(10 fps\)"):
        seconds_windows({"x": [0.0, 0.1]}, eps, tolerance_s=1e-4, history=None, horizon=None)
    got = seconds_windows({"x": [0.0]}, eps, tolerance_s=1e-4, history={"y": 2}, horizon=None)
    assert (got.history, got.horizon, got.trim) == ({"y": 2, "x": 1}, None, {})
    got = seconds_windows(None, eps, tolerance_s=1e-4, history=None, horizon={"y": 3})
    assert (got.history, got.horizon, got.trim) == (None, {"y": 3}, {})


def _spec(source):
    return SimpleNamespace(source=source)


def _schema_ep(eid, cameras, arrays):
    return SimpleNamespace(id=eid, cameras={k: _spec(s) for k, s in cameras.items()},
                           arrays={k: _spec(s) for k, s in arrays.items()})


def test_episodes_giving_a_key_two_source_names_are_refused_naming_both():
    index = SimpleNamespace(root="/data/x")
    a = _schema_ep("e0", {"cam": "observation.images.cam"}, {"state": "observation.state"})
    b = _schema_ep("e1", {"cam": "observation.images.top"}, {"state": "observation.state"})
    assert source_names(index, [a]) == {"cam": "observation.images.cam", "state": "observation.state"}
    with pytest.raises(ValueError, match="/data/x: episode 'e1' key 'cam' has source name 'observation.images.top' "
                                         "but episode 'e0' gives it 'observation.images.cam'"):
        source_names(index, [a, b])
    assert lerobot_keys(index, [a], ["state"]) == {"cam": "observation.images.cam", "state": "observation.state",
                                                    "state_pad": "observation.state_is_pad"}


def test_window_keys_resolve_only_unambiguous_source_names_that_are_no_key_themselves():
    e = _schema_ep("e0", {"a_b": "a.b", "c": "c"}, {"x_y": "x.y", "x-y": "x.y", "q": "a_b"})
    assert window_keys([e]) == {"a.b": "a_b"}


def test_a_run_far_from_the_current_step_warns_that_the_steps_between_are_read(caplog):
    eps = [_ep("a", 10.0)]
    got = seconds_windows({"near": [0.1, 0.2], "far": [0.5]}, eps, tolerance_s=1e-4, history=None, horizon=None)
    assert got.trim == {"near": (1, 0), "far": (5, 0)}
    assert [r.getMessage() for r in caplog.records] == [
        "delta_timestamps['far'] gives steps 5..5: the 5 steps between them and the current one are read too, then "
        "dropped"]
