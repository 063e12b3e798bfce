"""Hostile input to the raw and zarr readers: colliding names, text arrays, damaged videos, crafted metadata,
links that leave SRC. Every case is refused by name (one line; CLI exit 2), and nothing outside SRC is opened."""

import os
import pickle
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import cv2
import numpy as np
import pytest
from helpers import write_raw, write_zarr

import episodepipes
from episodepipes.pipes.builders import RESERVED
from episodepipes.sharding.episode import RESERVED_FIELDS, EpisodeData, EpisodeError
from episodepipes.sharding.formats.raw import RawReader
from episodepipes.sharding.formats.synthetic import SyntheticReader
from episodepipes.sharding.formats.zarr_reader import ZarrReader
from episodepipes.sharding.write import WriteOptions, write_shards

SYN = SyntheticReader(num_episodes=2, length=8, height=32, width=40)
REPO = Path(__file__).resolve().parents[2]


def _raw(tmp_path: Path, **kw: object) -> Path:
    return write_raw(tmp_path / "src", SYN, **kw)


def _png(path: Path, h: int = 32, w: int = 40) -> None:
    cv2.imwrite(str(path), np.full((h, w, 3), 128, np.uint8))


def _mp4(path: Path, n: int, *, h: int = 32, w: int = 48) -> None:
    """An mp4 with its index (moov) first, as most tools write them: a cut keeps it openable."""
    import av

    rng = np.random.default_rng(0)
    with av.open(str(path), "w", format="mp4", options={"movflags": "faststart"}) as c:
        s = c.add_stream("mpeg4", rate=10)
        s.width, s.height, s.pix_fmt = w, h, "yuv420p"
        for _ in range(n):
            c.mux(s.encode(av.VideoFrame.from_ndarray(rng.integers(0, 255, (h, w, 3), np.uint8), format="rgb24")))
        c.mux(s.encode())


def _read_all(reader, eid: str) -> EpisodeData:
    """Read an episode and iterate every camera, as the encoder does."""
    ep = reader.read(eid)
    for frames in ep.cameras.values():
        list(frames)
    return ep


def _one_line(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert "\n" not in msg
    return msg


# ---- names that collide once made tar-safe -------------------------------------------------------------------

def test_raw_cameras_that_share_a_field_name_are_refused(tmp_path):
    src = _raw(tmp_path)
    d = src / "ep0000"
    (d / "front").rename(d / "wrist.left")
    (d / "wrist").rename(d / "wrist_left")
    with pytest.raises(EpisodeError, match=r"episode 'ep0000'.*\['wrist.left', 'wrist_left'\].*'wrist_left'.*rename"):
        RawReader(src).read("ep0000")


def test_raw_camera_and_array_of_one_name_are_refused(tmp_path):
    src = _raw(tmp_path)
    (src / "ep0000" / "front").rename(src / "ep0000" / "state")  # arrays.npz has "state" too
    with pytest.raises(EpisodeError, match=r"ep0000.*\['state', 'state'\].*rename"):
        RawReader(src).read("ep0000")


@pytest.mark.parametrize("name", ["json", "__key__", "valid", "frame"])
def test_raw_names_that_take_a_reserved_field_are_refused(tmp_path, name):
    src = _raw(tmp_path)
    np.savez(src / "ep0000" / "arrays.npz", **{name: np.zeros(8, np.float32)})
    with pytest.raises(EpisodeError, match=f"ep0000.*{name!r}.*reserved.*rename"):
        RawReader(src).read("ep0000")


def test_reserved_fields_cover_the_batch_keys_of_the_pipes():
    assert set(RESERVED) <= RESERVED_FIELDS


def test_zarr_arrays_that_share_a_field_name_are_refused(tmp_path):
    import zarr

    src = write_zarr(tmp_path / "src", SYN)  # holds obs/state
    zarr.open_group(str(src / "ep0001.zarr"), mode="a").create_array("obs_state", data=np.zeros((8, 2), np.float32))
    with pytest.raises(EpisodeError, match=r"episode 'ep0001'.*\['obs/state', 'obs_state'\].*rename"):
        ZarrReader(src).read("ep0001")


def test_any_reader_gets_the_checks_through_episode_data():
    cams = {"a.b": [], "a_b": []}
    with pytest.raises(EpisodeError, match=r"\['a.b', 'a_b'\]"):
        EpisodeData("e", cams, {}, 10.0)
    for fps in (True, 0, -1.0, float("inf"), float("nan"), "10"):
        with pytest.raises(EpisodeError, match="fps="):
            EpisodeData("e", {"c": []}, {}, fps)
    with pytest.raises(EpisodeError, match="split=3 must be a string"):
        EpisodeData("e", {"c": []}, {}, 10.0, split=3)
    with pytest.raises(EpisodeError, match="'words'.*dtype <U1"):
        EpisodeData("e", {"c": []}, {"words": np.array(["a", "b"])}, 10.0)


# ---- text and object arrays ----------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.dtypes.StringDType(), "<U4", "|S4"])
def test_zarr_text_arrays_are_refused_by_key_and_dtype(tmp_path, dtype):
    import zarr

    src = write_zarr(tmp_path / "src", SYN)
    g = zarr.open_group(str(src / "ep0000.zarr"), mode="a")
    with pytest.warns() if dtype != np.dtypes.StringDType() else _nothing():
        g.create_array("obs/label", data=np.array(["pick"] * 8, dtype=dtype))
    with pytest.raises(EpisodeError, match=r"episode 'ep0000'.*array 'obs/label' has dtype.*convert it to numbers.*"
                                           r"meta\.json"):
        ZarrReader(src).read("ep0000")


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_npz_text_and_object_arrays_are_refused_by_name(tmp_path):
    src = _raw(tmp_path)
    np.savez(src / "ep0000" / "arrays.npz", label=np.array(["x"] * 8))
    with pytest.raises(EpisodeError, match=r"ep0000.*array 'label' has dtype <U1.*convert it to numbers"):
        RawReader(src).read("ep0000")
    np.savez(src / "ep0001" / "arrays.npz", things=np.array([{"a": 1}] * 8, dtype=object))
    with pytest.raises(EpisodeError, match=r"ep0001.*array 'things'.*without pickle.*convert it to numbers"):
        RawReader(src).read("ep0001")


class _Boom:
    """Unpickling this creates a file: the proof that a pickle was loaded."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (Path(self.path).touch, ())


def test_a_pickle_named_arrays_npz_is_never_unpickled(tmp_path):
    src = _raw(tmp_path)
    proof = tmp_path / "unpickled"
    (src / "ep0000" / "arrays.npz").write_bytes(pickle.dumps(_Boom(str(proof))))
    with pytest.raises(EpisodeError, match=r"ep0000.*arrays\.npz is not a \.npz"):
        RawReader(src).read("ep0000")
    assert not proof.exists()


# ---- damaged videos ------------------------------------------------------------------------------------------

def test_truncated_video_is_named_with_frames_decoded_and_declared(tmp_path):
    src = tmp_path / "src"
    (src / "ep0").mkdir(parents=True)
    video = src / "ep0" / "front.mp4"
    _mp4(video, 40)
    data = video.read_bytes()
    video.write_bytes(data[: len(data) // 3])
    np.savez(src / "ep0" / "arrays.npz", state=np.zeros((40, 2), np.float32))
    with pytest.raises(EpisodeError) as e:
        write_shards(RawReader(src), tmp_path / "out", WriteOptions(format="raw"))
    msg = _one_line(e)
    assert f"video {video} is truncated or damaged: it decoded " in msg and "container declares 40" in msg
    decoded = int(msg.split("it decoded ")[1].split()[0])
    assert 0 <= decoded < 40


def test_video_shorter_than_the_arrays_names_the_video(tmp_path):
    src = tmp_path / "src"
    (src / "ep0").mkdir(parents=True)
    _mp4(src / "ep0" / "front.mp4", 5)
    np.savez(src / "ep0" / "arrays.npz", state=np.zeros((8, 2), np.float32))
    with pytest.raises(EpisodeError, match=r"front\.mp4 is truncated or damaged: it decoded 5 frames, but the "
                                           r"episode's arrays have 8"):
        _read_all(RawReader(src), "ep0")


def test_playlist_named_mp4_is_not_probed(tmp_path):
    """An ffconcat list named front.mp4 would make FFmpeg open the file it names; the demuxer is fixed instead."""
    src = _raw(tmp_path)
    _mp4(src / "ep0000" / "hidden.bin", 8, h=32, w=40)  # not a camera: the reader must never open it
    shutil.rmtree(src / "ep0000" / "front")
    (src / "ep0000" / "front.mp4").write_text("ffconcat version 1.0\nfile hidden.bin\n")
    with pytest.raises(EpisodeError, match=r"ep0000.*cannot decode video .*front\.mp4"):
        _read_all(RawReader(src), "ep0000")


# ---- meta.json from strangers --------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "match"), [
    ("{fps: 10", r"meta\.json is not valid JSON"),
    ("[" * 100_000 + "]" * 100_000, r"meta\.json is nested too deeply"),
    ("[10]", r"meta\.json must hold a JSON object.*not a list"),
    ('{"fps": 10, "fps": 0}', r"meta\.json is not valid JSON \(keys \['fps'\] appear more than once"),
    ('{"fps": 0}', "fps=0 is not a positive"),
    ('{"fps": -5}', "fps=-5 is not a positive"),
    ('{"fps": Infinity}', "fps=inf is not a positive"),
    ('{"fps": NaN}', "fps=nan is not a positive"),
    ('{"fps": true}', "fps=True is not a positive"),
    ('{"fps": "10"}', "fps='10' is not a positive"),
    ('{"fps": 10, "split": 1}', "split=1 must be a string"),
    ('{"fps": 10, "prompt": ["a"]}', r"prompt=\['a'\] must be a string"),
    ('{"fps": 10, "robot": {"arm": 1}}', "metadata robot=.* is a dict"),
    ('{"fps": 10, "gain": NaN}', "metadata gain=nan is not a finite number"),
    ('"\\ud800"', r"meta\.json must hold a JSON object"),
])
def test_crafted_meta_json_is_refused_in_one_line(tmp_path, text, match):
    src = _raw(tmp_path)
    (src / "ep0000" / "meta.json").write_text(text)
    with pytest.raises(EpisodeError, match=f"episode 'ep0000'.*{match}") as e:
        RawReader(src).read("ep0000")
    _one_line(e)


def test_meta_json_that_is_not_utf8_or_too_big_is_named(tmp_path):
    src = _raw(tmp_path)
    (src / "ep0000" / "meta.json").write_bytes(b'{"fps": 10, "prompt": "\xff"}')
    with pytest.raises(EpisodeError, match=r"ep0000.*meta\.json is not valid JSON"):
        RawReader(src).read("ep0000")
    (src / "ep0001" / "meta.json").write_text('{"fps": 10, "prompt": "' + "x" * (2 << 20) + '"}')
    with pytest.raises(EpisodeError, match=r"ep0001.*meta\.json is not a file of at most"):
        RawReader(src).read("ep0001")


def test_extra_meta_keys_are_kept(tmp_path):
    src = _raw(tmp_path)
    (src / "ep0000" / "meta.json").write_text('{"fps": 15, "prompt": "p", "robot": "franka", "seed": 3, "ok": true}')
    ep = RawReader(src).read("ep0000")
    assert (ep.fps, ep.prompt, ep.split, ep.extra) == (15.0, "p", None, {"robot": "franka", "seed": 3, "ok": True})


def test_zarr_attrs_are_checked_and_scalars_kept(tmp_path):
    import zarr

    src = write_zarr(tmp_path / "src", SYN)
    g = zarr.open_group(str(src / "ep0000.zarr"), mode="a")
    g.attrs.update({"robot": "ur5", "intrinsics": [[1, 0], [0, 1]]})
    assert ZarrReader(src).read("ep0000").extra == {"robot": "ur5"}
    for bad, match in (({"fps": True}, "fps=True"), ({"fps": float("inf")}, "fps=inf"),
                       ({"prompt": 5}, "prompt=5 must be a string"), ({"split": 1}, "split=1 must be a string")):
        g.attrs.update({"fps": 10, "prompt": "", "split": "train", **bad})
        with pytest.raises(EpisodeError, match=f"episode 'ep0000'.*attrs.*{match}"):
            ZarrReader(src).read("ep0000")


# ---- image folders -------------------------------------------------------------------------------------------

def test_image_folder_frames_that_are_not_images_or_change_size_are_named(tmp_path):
    src = _raw(tmp_path)
    bad = src / "ep0000" / "front" / "000003.png"
    bad.write_text("not a png")
    with pytest.raises(EpisodeError, match=f"ep0000.*{bad} is not a decodable image"):
        _read_all(RawReader(src), "ep0000")
    small = src / "ep0001" / "wrist" / "000005.png"
    _png(small, 16, 20)
    with pytest.raises(EpisodeError, match=rf"ep0001.*image {small}: frame 5 is \(16, 20\), frame 0 was \(32, 40\)"):
        _read_all(RawReader(src), "ep0001")


# ---- links that leave SRC ------------------------------------------------------------------------------------

def _outside(tmp_path: Path) -> Path:
    """A valid episode outside SRC (so a reader that followed the links would succeed)."""
    out = write_raw(tmp_path / "elsewhere", SyntheticReader(num_episodes=1, length=8, height=32, width=40))
    _mp4(out / "ep0000" / "cam.mp4", 8)
    return out / "ep0000"


def _link(link: Path, target: Path) -> None:
    if link.is_dir() and not link.is_symlink():
        shutil.rmtree(link)
    elif link.exists() or link.is_symlink():
        link.unlink()
    link.symlink_to(target)


def _hostile_src(tmp_path: Path) -> tuple[Path, Path]:
    """SRC whose episodes 1.. each hold one link leaving SRC; episode 0 holds links that stay inside."""
    far = _outside(tmp_path)
    src = write_raw(tmp_path / "src", SyntheticReader(num_episodes=7, length=8, height=32, width=40))
    _link(src / "ep0000" / "front" / "000001.png", src / "ep0000" / "front" / "000002.png")  # inside: followed
    _link(src / "ep0001", far)
    _link(src / "ep0002" / "meta.json", far / "meta.json")
    _link(src / "ep0003" / "arrays.npz", far / "arrays.npz")
    _link(src / "ep0004" / "front" / "000003.png", far / "front" / "000003.png")
    _link(src / "ep0005" / "front", far / "front")
    (src / "ep0006" / "front").rename(src / "ep0006" / "keep")
    _link(src / "ep0006" / "front.mp4", far / "cam.mp4")
    return src, far


@pytest.mark.parametrize("eid", ["ep0001", "ep0002", "ep0003", "ep0004", "ep0005", "ep0006"])
def test_raw_links_leaving_src_are_refused(tmp_path, eid):
    src, far = _hostile_src(tmp_path)
    with pytest.raises(EpisodeError, match=f"episode {eid!r}: .* leads to {far}.*outside the source folder") as e:
        _read_all(RawReader(src), eid)
    _one_line(e)


def test_links_inside_src_are_followed(tmp_path):
    src, _ = _hostile_src(tmp_path)
    ep = _read_all(RawReader(src), "ep0000")
    assert len(list(ep.cameras["front"])) == 8


def test_zarr_chunk_linking_outside_src_is_refused(tmp_path):
    src = write_zarr(tmp_path / "src", SYN)
    far = write_zarr(tmp_path / "elsewhere", SYN)
    chunks = sorted(p for p in (src / "ep0000.zarr" / "action").rglob("*") if p.is_file() and p.name != "zarr.json")
    _link(chunks[0], far / "ep0000.zarr" / "action" / chunks[0].relative_to(src / "ep0000.zarr" / "action"))
    with pytest.raises(EpisodeError, match=f"episode 'ep0000': .*{chunks[0].name} leads to .*outside the source"):
        ZarrReader(src).read("ep0000")
    _link(src / "ep0001.zarr", far / "ep0001.zarr")
    with pytest.raises(EpisodeError, match="episode 'ep0001': .* leads to .*outside the source"):
        ZarrReader(src).read("ep0001")


def test_episode_ids_that_leave_src_are_refused(tmp_path):
    src = _raw(tmp_path)
    for eid in ("..", "../src", "/etc"):
        with pytest.raises(EpisodeError, match="not a folder name inside"):
            RawReader(src).read(eid)
        with pytest.raises(EpisodeError, match="not a store name inside"):
            ZarrReader(src).read(eid + "/x")


# ---- nothing outside SRC is opened ---------------------------------------------------------------------------

_OPENED: list[str] | None = None


def _hook(event: str, args: tuple) -> None:
    if _OPENED is not None and event in ("open", "os.listdir", "os.scandir") and args \
            and isinstance(args[0], (str, bytes, os.PathLike)):
        _OPENED.append(os.fsdecode(args[0]))


sys.addaudithook(_hook)  # cannot be removed; it records only while a test sets _OPENED


def _opened_while(fn) -> list[str]:
    global _OPENED
    _OPENED = []
    try:
        fn()
    finally:
        opened, _OPENED = _OPENED, None
    return opened


def _outside_of(opened: list[str], *roots: Path) -> list[str]:
    allowed = [*(r.resolve() for r in roots), Path(episodepipes.__file__).resolve().parent,
               *{Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sys.exec_prefix,
                                             *sysconfig.get_paths().values())}]
    return sorted({p for p in opened if not any(Path(p).resolve().is_relative_to(a) for a in allowed)})


def test_writing_a_hostile_src_opens_nothing_outside_src(tmp_path):
    src, far = _hostile_src(tmp_path)
    out, res = tmp_path / "out", []
    opened = _opened_while(lambda: res.append(
        write_shards(RawReader(src), out, WriteOptions(format="raw", skip_bad=True), workers=1)))
    assert sorted(s["id"] for s in res[0].skipped) == [f"ep000{i}" for i in range(1, 7)]
    assert res[0].episodes == 1
    assert _outside_of(opened, src, out) == []
    assert not [p for p in opened if Path(p).resolve().is_relative_to(far.resolve())]
    assert any(Path(p).resolve().is_relative_to(src.resolve()) for p in opened)  # the hook did see the reads


def test_writing_a_hostile_zarr_src_opens_nothing_outside_src(tmp_path):
    src = write_zarr(tmp_path / "src", SYN)
    far = write_zarr(tmp_path / "elsewhere", SYN)
    _link(src / "ep0001.zarr" / "action", far / "ep0001.zarr" / "action")
    out, res = tmp_path / "out", []
    opened = _opened_while(lambda: res.append(
        write_shards(ZarrReader(src), out, WriteOptions(format="zarr", skip_bad=True), workers=1)))
    assert [s["id"] for s in res[0].skipped] == ["ep0001"] and res[0].episodes == 1
    assert _outside_of(opened, src, out) == []
    assert any(Path(p).resolve().is_relative_to(src.resolve()) for p in opened)


# ---- the CLI: one line, exit 2 -------------------------------------------------------------------------------

def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "scripts" / "shard.py"), *args], capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("case", ["nested", "truncated", "collision", "link"])
def test_cli_reports_reader_errors_in_one_line_with_exit_2(tmp_path, case):
    src = _raw(tmp_path)
    if case == "nested":
        (src / "ep0001" / "meta.json").write_text("[" * 100_000)
        want = r"meta\.json is nested too deeply"
    elif case == "truncated":
        _mp4(src / "ep0001" / "front.mp4", 8, h=32, w=40)
        shutil.rmtree(src / "ep0001" / "front")
        data = (src / "ep0001" / "front.mp4").read_bytes()
        (src / "ep0001" / "front.mp4").write_bytes(data[: len(data) // 3])
        want = r"front\.mp4 is truncated or damaged"
    elif case == "collision":
        (src / "ep0001" / "front").rename(src / "ep0001" / "wrist.0")
        (src / "ep0001" / "wrist").rename(src / "ep0001" / "wrist_0")
        want = r"\['wrist.0', 'wrist_0'\] would share"
    else:
        _link(src / "ep0001" / "arrays.npz", _outside(tmp_path) / "arrays.npz")
        want = "outside the source folder"
    r = _cli("write", str(src), str(tmp_path / "out"), "--workers", "2")
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert re.search(f"episodepipes-shard: error: episode 'ep0001'.*{want}", lines[0]), lines[0]


def test_opencv_fallback_names_truncated_videos_and_playlists_too(tmp_path, monkeypatch):
    from episodepipes.sharding.formats import video

    monkeypatch.setattr(video, "av", None)  # as without the optional PyAV: OpenCV decodes
    src = tmp_path / "src"
    (src / "ep0").mkdir(parents=True)
    _mp4(src / "ep0" / "front.mp4", 40)
    data = (src / "ep0" / "front.mp4").read_bytes()
    (src / "ep0" / "front.mp4").write_bytes(data[: len(data) // 3])
    (src / "ep0" / "meta.json").write_text('{"fps": 10}')
    with pytest.raises(EpisodeError, match=r"front\.mp4 is truncated or damaged: it decoded \d+ frames, but its "
                                           "container declares 40"):
        _read_all(RawReader(src), "ep0")
    (src / "ep0" / "front.mp4").write_text("ffconcat version 1.0\nfile hidden.bin\n")
    with pytest.raises(EpisodeError, match=r"cannot decode video .*front\.mp4 \(its bytes are not a \.mp4 container"):
        _read_all(RawReader(src), "ep0")
