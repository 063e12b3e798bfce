import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from episodepipes.format import sample_key, tar_member
from episodepipes.pipes.order.window import (
    Window,
    damaged_sample,
    fields_by_step,
    plan_windows,
    window_sample,
    window_steps,
)
from episodepipes.pipes.plan import Item
from episodepipes.pipes.sample_decode import EpisodeSpec, SampleDecode
from episodepipes.tarmembers import frame_fields

CAMS, ARRS = {"front", "wrist"}, {"state", "action"}


def test_plan_windows_convention():
    w = plan_windows({"state": 3, "front": 2}, {"action": 4, "state": 2}, cameras=CAMS, arrays=ARRS)
    assert w["state"] == Window("state", "state.npy", -2, 1)  # t-2 .. t+1, current step once
    assert w["front"] == Window("front", "front.jpg", -1, 0)
    assert w["action"] == Window("action", "action.npy", 0, 3)
    assert w["action"].size == 4 and "wrist" not in w


@pytest.mark.parametrize("history, match", [({"nope": 2}, "not a camera or array"), ({"state": 0}, "positive int"),
                                            ({"state": True}, "positive int"), ([("state", 2)], "dict")])
def test_plan_windows_refuses_bad_specs(history, match):
    with pytest.raises((ValueError, TypeError), match=match):
        plan_windows(history, None, cameras=CAMS, arrays=ARRS)


def test_pad_mask_name_clash_is_refused():
    with pytest.raises(ValueError, match="state_pad"):
        plan_windows({"state": 2}, None, cameras=CAMS, arrays=ARRS | {"state_pad"})


@given(length=st.integers(1, 30), data=st.data(), k=st.integers(1, 8), h=st.integers(1, 8))
def test_window_steps_pad_with_nearest_real_step(length, data, k, h):
    t = data.draw(st.integers(0, length - 1))
    w = Window("state", "state.npy", 1 - k, h - 1)
    steps, pad = window_steps(t, length, w)
    raw = np.arange(t - k + 1, t + h)
    assert len(steps) == k + h - 1 and steps[k - 1] == t and not pad[k - 1]
    assert np.array_equal(pad, (raw < 0) | (raw >= length))
    assert np.array_equal(steps[~pad], raw[~pad])
    assert all(s == (0 if r < 0 else length - 1) for s, r in zip(steps[pad], raw[pad]))
    need = fields_by_step(t, length, {"state": w})
    assert set(need) == set(steps.tolist()) - {t} and all(v == {"state.npy"} for v in need.values())


def _frame(ep, t, fields):
    return b"".join(tar_member(f"{sample_key(ep, t)}.{f}", d) for f, d in sorted(fields.items()))


def test_frame_fields_reads_only_wanted_members():
    big = {"front.jpg": b"J" * 5000, "state.npy": b"S" * 40, "json": b"{}"}
    blob = _frame("ep" + "x" * 120, 3, big)  # > 100-byte names take GNU long-name members
    pread = lambda n, off: blob[off:off + n]  # noqa: E731
    whole, n_whole = frame_fields(pread, 0, len(blob), "ep" + "x" * 120, 3)
    assert whole == big and n_whole == len(blob)
    part, n_part = frame_fields(pread, 0, len(blob), "ep" + "x" * 120, 3, {"state.npy"})
    assert part == {"state.npy": b"S" * 40} and n_part < len(blob) - 5000  # the JPEG data is skipped
    with pytest.raises(ValueError, match="not in frame"):
        frame_fields(pread, 0, len(blob), "other", 3)
    with pytest.raises(ValueError, match="no member"):
        frame_fields(pread, 0, len(blob), "ep" + "x" * 120, 3, {"wrist.jpg"})


def _npy(a):
    from episodepipes.format import npy_bytes

    return npy_bytes(np.asarray(a, np.float32))


def _spec(arrays=None, cameras=None, prompt=""):
    return EpisodeSpec(cameras or {}, arrays or {}, 10.0, prompt)


F4 = {"state": ("<f4", (1,)), "action": ("<f4", (1,))}


def test_window_sample_and_decode_give_source_values_and_masks():
    windows = plan_windows({"state": 3}, {"action": 2}, cameras=set(), arrays={"state", "action"})
    length, t = 4, 0
    read = {s: {"state.npy": _npy([s]), "action.npy": _npy([10 + s]), "json": b'{"timestamp": 0.5}'}
            for s in range(length)}
    raw = window_sample(Item("ep", t), "shard-000000.tar", length, windows, read)
    assert set(raw.members) == {"json"} and set(raw.windows) == {"action", "state"}  # no magic member names
    assert raw.windows["state"].steps == (0, 0, 0) and raw.windows["state"].pad == (True, True, False)
    out = SampleDecode(transform=_add_one)(raw, _spec(F4, prompt="go"))
    fields = out.fields
    assert out.corrupt == [] and out.frames == 0
    assert fields["state"].ravel().tolist() == [0, 0, 0] and fields["state_pad"].tolist() == [True, True, False]
    assert fields["action"].ravel().tolist() == [10, 11] and fields["action_pad"].tolist() == [False, False]
    # the timestamp is the frame over the episode's fps (as the writer writes it), never parsed from the member
    assert (fields["episode"], fields["frame"], fields["prompt"], fields["timestamp"]) == ("ep", 0, "go", t / 10.0)
    assert fields["plus_one"] == 1


def _add_one(sample):
    return {**sample, "plus_one": sample["frame"] + 1}


@given(length=st.integers(1, 12), data=st.data(), k=st.integers(1, 5), h=st.integers(1, 5))
def test_decoded_windows_equal_the_source_rows_at_clamped_steps(length, data, k, h):
    t = data.draw(st.integers(0, length - 1))
    state = np.arange(length * 2, dtype=np.float32).reshape(length, 2)
    action = -state
    windows = plan_windows({"state": k}, {"action": h, "state": 2}, cameras=set(), arrays={"state", "action"})
    read = {s: {"state.npy": _npy(state[s]), "action.npy": _npy(action[s])} for s in range(length)}
    raw = window_sample(Item("e", t), "s", length, windows, read)
    fields = SampleDecode()(raw, _spec({"state": ("<f4", (2,)), "action": ("<f4", (2,))})).fields
    hist = np.clip(np.arange(t - k + 1, t + 2), 0, length - 1)
    assert np.array_equal(fields["state"], state[hist]) and fields["state"].shape == (k + 1, 2)
    assert np.array_equal(fields["action"], action[np.clip(np.arange(t, t + h), 0, length - 1)])
    assert fields["state_pad"].tolist() == [not 0 <= s < length for s in range(t - k + 1, t + 2)]


def test_a_damaged_sample_decodes_to_zeros_of_every_shape_with_its_pad_masks():
    w = plan_windows({"state": 3, "front": 2}, {"action": 4}, cameras=CAMS, arrays=ARRS)
    raw = damaged_sample(Item("ep", 1), "s", 4, w, "frame 0 does not match its crc32")
    assert raw.damaged and raw.members == {} and all(not sw.data for sw in raw.windows.values())
    spec = EpisodeSpec({"front": (16, 24), "wrist": (16, 24)}, {"state": ("<f4", (7,)), "action": (">f8", (2,))},
                       10.0, "p")
    out = SampleDecode(resize=(8, 12))(raw, spec)
    fields = out.fields
    assert out.corrupt == ["front", "wrist"] and out.frames == 0  # all corrupt, none decoded
    shapes = {k: (v.shape, v.dtype.str) for k, v in fields.items() if isinstance(v, np.ndarray) and "_pad" not in k}
    assert shapes == {"front": ((2, 3, 8, 12), "|u1"), "wrist": ((3, 8, 12), "|u1"), "state": ((3, 7), "<f4"),
                      "action": ((4, 2), "<f8")}  # native order, as npy_load returns arrays
    assert not any(v.any() for k, v in fields.items() if isinstance(v, np.ndarray) and "_pad" not in k)
    assert fields["state_pad"].tolist() == [True, False, False]
    assert fields["action_pad"].tolist() == [False, False, False, True]
    assert (fields["episode"], fields["frame"], fields["prompt"]) == ("ep", 1, "p")
