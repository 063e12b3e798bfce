"""Hostile LeRobot metadata: crafted info.json, episode records, data rows and image cells.

Each case must end in one named, one-line error, and nothing outside the dataset root may be opened.
Two observers check the second part: an audit hook sees every open made by Python, and inotify on a
folder of decoy files beside the dataset sees opens made by C libraries too (pyarrow, FFmpeg).
"""

import ctypes
import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import episodepipes
from benchmarks.lerobot_data import IMAGE_KEY, available_encoders, make_lerobot
from episodepipes.sharding import cli
from episodepipes.sharding.formats.lerobot import LeRobotReader

REPO = Path(episodepipes.__file__).resolve().parents[1]
META = "meta/episodes/chunk-000/file-000.parquet"
DATA = "data/chunk-000/file-000.parquet"
FRONT = "videos/observation.images.front/chunk-000/file-000.mp4"
DEL = object()
_OPENED: list[object] | None = None  # what the audit hook records while a case runs


def _audit(event: str, args: tuple) -> None:
    if event == "open" and _OPENED is not None:
        _OPENED.append(args[0])


sys.addaudithook(_audit)  # hooks cannot be removed; it records only inside `_watching`


class _Inotify:
    """Open/read events on the files of one folder, by any code of this process or its children."""

    MASK = 0x20 | 0x01  # IN_OPEN | IN_ACCESS

    def __init__(self, folder: Path) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self.fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0 or libc.inotify_add_watch(self.fd, os.fsencode(folder), self.MASK) < 0:
            raise OSError(ctypes.get_errno(), f"inotify on {folder}")

    def events(self) -> list[str]:
        out = []
        while True:
            try:
                buf = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                os.close(self.fd)
                return out
            pos = 0
            while pos < len(buf):
                _, mask, _, size = struct.unpack_from("iIII", buf, pos)
                name = buf[pos + 16:pos + 16 + size].rstrip(b"\0").decode()
                out.append(f"{name} mask={mask:#x}")
                pos += 16 + size


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """Two 3-frame episodes in one h264 mp4 per camera, with an image feature; copied per test."""
    root = tmp_path_factory.mktemp("lerobot") / "lr"
    make_lerobot(root, num_episodes=2, length=3, height=32, width=48, encoder=available_encoders(("h264",))[0])
    return root


@pytest.fixture
def src(dataset, tmp_path):
    """A fresh copy of the dataset, and beside it ``outside/``: decoys a hostile dataset may point at."""
    shutil.copytree(dataset, tmp_path / "lr")
    outside = tmp_path / "outside"
    (outside / "meta/episodes/chunk-000").mkdir(parents=True)
    for name, rel in (("secret.parquet", DATA), ("secret.mp4", FRONT), ("secret.json", "meta/info.json"),
                      ("meta/info.json", "meta/info.json"),
                      ("meta/episodes/chunk-000/file-000.parquet", META)):
        shutil.copy(dataset / rel, outside / name)
    (outside / "secret.png").write_bytes(pq.read_table(dataset / DATA).column(IMAGE_KEY)[0]["bytes"].as_py())
    return tmp_path / "lr"


def _watching(src: Path, fn, *extra: Path) -> list[str]:  # noqa: ANN001
    """Run ``fn()``; returns the opens outside SRC, ``extra`` and the Python install, and of any decoy."""
    global _OPENED
    watch, _OPENED = _Inotify(src.parent / "outside"), []
    try:
        fn()
    finally:
        opened, _OPENED = _OPENED, None
        decoys = watch.events()
    allowed = [p.resolve() for p in (src, *extra, REPO, Path(sys.prefix), Path(sys.base_prefix))]
    strays = [str(p) for p in opened if not isinstance(p, int)
              and not any(Path(os.fsdecode(p)).resolve().is_relative_to(a) for a in allowed)]
    return strays + [f"decoy {d}" for d in decoys]


def _read_all(src: Path) -> None:
    reader = LeRobotReader(src)
    for eid in reader.episode_ids():
        for frames in reader.read(eid).cameras.values():
            list(frames)


def _refused(src: Path, match: str, exc: type[Exception] = ValueError) -> None:
    """Reading every frame of ``src`` fails with one named line, and opens nothing outside it."""
    caught = []

    def attempt() -> None:
        with pytest.raises(exc, match=match) as e:
            _read_all(src)
        caught.append(e.value)

    assert _watching(src, attempt) == []
    assert "\n" not in str(caught[0])


def test_the_observers_see_opens_outside_the_root(src):
    # the checks above are only as good as these two observers: both must report a stray open
    outside = src.parent / "outside"
    strays = _watching(src, lambda: (outside / "secret.json").read_bytes())
    assert str(outside / "secret.json") in strays and any(s.startswith("decoy secret.json") for s in strays)
    assert "decoy secret.parquet mask=0x20" in _watching(src, lambda: pq.read_table(outside / "secret.parquet"))
    assert _watching(src, lambda: _read_all(src)) == []


# --- crafting helpers ----------------------------------------------------------------------------

def _info(src: Path, raw: str | None = None, **changes: object) -> None:
    path = src / "meta/info.json"
    if raw is not None:
        path.write_text(raw)
        return
    info = json.loads(path.read_text())
    for k, v in changes.items():
        if v is DEL:
            info.pop(k, None)
        else:
            info[k] = v
    path.write_text(json.dumps(info))


def _set(path: Path, column: str, values: list, type: pa.DataType | None = None) -> None:
    t = pq.read_table(path)
    pq.write_table(t.set_column(t.schema.get_field_index(column), column, pa.array(values, type)), path)


def _link(path: Path, target: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()
    path.symlink_to(target)


def _images(src: Path, paths: list[str]) -> None:
    """Image cells that name files instead of holding bytes."""
    n = pq.read_table(src / DATA).num_rows
    cells = [{"bytes": None, "path": paths[i % len(paths)]} for i in range(n)]
    _set(src / DATA, IMAGE_KEY, cells, pa.struct([("bytes", pa.binary()), ("path", pa.string())]))


# --- paths: templates, image cells and symlinks that leave the root ------------------------------

@pytest.mark.parametrize(("field", "value", "match"), [
    ("data_path", "/dev/zero", r"file-000.parquet episode_index 0: data_path: path '/dev/zero' must be relative"),
    ("data_path", "../outside/secret.parquet", r"data_path: path '../outside/secret.parquet' must be relative"),
    ("video_path", "videos/{video_key}/../../../outside/secret.mp4",
     r"episode_index 0: video_path: path .*without '..'"),
    ("data_path", "{chunk_index.__class__}", r"info.json: data_path='\{chunk_index.__class__\}' uses \{chunk_"
                                             r"index.__class__\}; only \{chunk_index\}, \{file_index\} are allowed"),
    ("data_path", "{chunk_index[0]}.parquet", r"data_path=.* uses \{chunk_index\[0\]\}.*no attribute or item"),
    ("video_path", "{video_key.__len__}.mp4", r"video_path=.* uses \{video_key.__len__\}"),
    ("data_path", "{episode_index}.parquet", r"uses \{episode_index\}; only \{chunk_index\}, \{file_index\} are"),
    ("data_path", "{0}.parquet", r"uses \{0\}"),
    ("data_path", "{}.parquet", r"uses \{\}"),
    ("data_path", "{chunk_index:999999999d}", r"\{chunk_index\} may take no conversion and at most a width"),
    ("data_path", "{chunk_index:{file_index}}", r"\{chunk_index\} may take no conversion"),
    ("data_path", "{chunk_index!r}", r"\{chunk_index\} may take no conversion"),
    ("video_path", "{video_key:>99999}", r"\{video_key\} may take no conversion"),
    ("data_path", "data/{chunk_index", r"data_path='data/\{chunk_index' is not a valid template"),
    ("data_path", 42, r"info.json: data_path=42 must be a path template string"),
    ("data_path", DEL, r"info.json: data_path=None must be a path template string"),
    ("video_path", DEL, r"info.json: video_path=None must be a path template string"),
])
def test_path_templates_are_refused_by_name(src, field, value, match):
    _info(src, **{field: value})
    _refused(src, match)


def test_absolute_template_to_a_decoy_is_refused_without_opening_it(src):
    _info(src, data_path=str(src.parent / "outside/secret.parquet"))
    _refused(src, r"data_path: path '/.*outside/secret.parquet' must be relative")


@pytest.mark.parametrize(("rel", "target", "match"), [
    (DATA, "outside/secret.parquet", r"episode 'episode_000000' data_path: .*file-000.parquet' resolves to "
                                     r".*outside/secret.parquet, outside the dataset root"),
    (DATA, "/dev/zero", r"data_path: .* resolves to /dev/zero, outside the dataset root"),
    ("data", "outside", r"data_path: .* outside the dataset root"),
    (FRONT, "outside/secret.mp4", r"camera 'observation.images.front' video_path: .* outside the dataset root"),
    ("meta/info.json", "outside/secret.json", r"meta/info.json: 'meta/info.json' resolves to .*outside/secret.json"),
    ("meta/episodes/chunk-000", "outside/meta/episodes/chunk-000", r"meta/episodes/chunk-000: .* outside the"),
    ("meta/episodes", "outside/meta/episodes", r"meta/episodes: .* outside the dataset root"),
    ("meta", "outside/meta", r"meta/info.json: .* outside the dataset root"),
])
def test_symlinks_that_leave_the_root_are_refused(src, rel, target, match):
    _link(src / rel, target if target.startswith("/") else src.parent / target)
    _refused(src, match)


def test_a_fifo_or_folder_in_place_of_a_file_is_refused(src):
    (src / DATA).unlink()
    os.mkfifo(src / DATA)  # opening it would block forever
    _refused(src, r"episode 'episode_000000' data_path: .*file-000.parquet is not a regular file")
    (src / DATA).unlink()
    (src / DATA).mkdir()
    _refused(src, r"file-000.parquet is not a regular file")


@pytest.mark.parametrize(("paths", "match"), [
    (["/dev/zero"], r"image feature 'observation.images.gripper' .* row 0: image path: path '/dev/zero' must be"),
    (["../outside/secret.png"], r"row 0: image path: path '../outside/secret.png' must be relative"),
    (["images/../../outside/secret.png"], r"row 0: image path: .* without '..'"),
    (["ok.png", "/etc/passwd"], r"row 1: image path: path '/etc/passwd' must be relative"),
    (["link.png"], r"row 0: image path: 'link.png' resolves to .*outside/secret.png, outside the dataset root"),
    (["missing.png"], r"row 0: image path 'missing.png' is missing"),
])
def test_image_cells_naming_files_outside_the_root_are_refused(src, paths, match):
    shutil.copy(src.parent / "outside/secret.png", src / "ok.png")
    (src / "link.png").symlink_to(src.parent / "outside/secret.png")
    _images(src, [str(src.parent / "outside/secret.png") if p == "abs" else p for p in paths])
    _refused(src, match)


def test_image_cells_naming_files_inside_the_root_are_read(src):
    want = [np.stack(list(LeRobotReader(src).read(e).cameras["observation_images_gripper"]))
            for e in ("episode_000000", "episode_000001")]
    (src / "images").mkdir()
    shutil.copy(src.parent / "outside/secret.png", src / "images/frame.png")  # frame 0 of episode 0
    _images(src, ["images/frame.png"])
    got = list(LeRobotReader(src).read("episode_000001").cameras["observation_images_gripper"])
    assert len(got) == 3
    np.testing.assert_array_equal(got[2], want[0][0])


def test_image_cells_of_the_wrong_type_are_refused(src):
    _set(src / DATA, IMAGE_KEY, ["frame.png"] * pq.read_table(src / DATA).num_rows)
    _refused(src, r"image feature 'observation.images.gripper' .* row 0: an image cell is str, not \{bytes, path\}")


# --- info.json fields ----------------------------------------------------------------------------

@pytest.mark.parametrize(("value", "match"), [
    (0, "fps=0 must be"), (-10, "fps=-10 must be"), (float("inf"), "fps=inf must be"),
    (float("nan"), "fps=nan must be"),
    (True, "fps=True must be"), ("10", "fps='10' must be"), (None, "fps=None must be"), (DEL, "fps=None must be"),
])
def test_bad_fps_is_refused_by_name(src, value, match):
    _info(src, fps=value)
    _refused(src, r"meta/info.json: " + match + r" a finite number > 0 \(frames per second\) from 0.001 to 1000, "
             r"what a video container stores; fix meta/info.json")


@pytest.mark.parametrize(("features", "match"), [
    ([], r"features=\[\] must be a non-empty object"),
    (DEL, r"features=None must be a non-empty object"),
    ({"x": 3}, r"features\['x'\]=3 must be an object with a string 'dtype'"),
    ({"x": {"dtype": ["video"]}}, r"features\['x'\]=.* must be an object with a string 'dtype'"),
    ({"x": {"dtype": "float32", "shape": ["7"]}}, r"features\['x'\].shape=\['7'\] must be a list of at most 32"),
    ({"x": {"dtype": "float32", "shape": [-1]}}, r"features\['x'\].shape=\[-1\]"),
    ({"x": {"dtype": "float32", "shape": 7}}, r"features\['x'\].shape=7"),
    ({"": {"dtype": "float32", "shape": [1]}}, r"meta/info.json: (features: )?name '' has no usable characters"),
])
def test_bad_features_are_refused_by_name(src, features, match):
    _info(src, features=features)
    _refused(src, match)


@pytest.mark.parametrize(("raw", "match"), [
    ("{", r"meta/info.json: invalid JSON \(Expecting property name"),
    ("[" * 100_000 + "]" * 100_000, r"meta/info.json: JSON nested too deeply to read"),
    ("\xff\xfe", r"meta/info.json: invalid JSON"),
    ("[1, 2]", r"meta/info.json: expected a JSON object, got list"),
    ("9" * 5000, r"meta/info.json: invalid JSON"),
])
def test_unreadable_info_json_names_the_file(src, raw, match):
    (src / "meta/info.json").write_bytes(raw.encode("latin-1"))
    _refused(src, match)


def test_a_huge_info_json_is_not_read(src):
    with open(src / "meta/info.json", "r+b") as f:
        f.truncate(64 * 2**20)
    _refused(src, r"meta/info.json: 67108864 bytes is too large for LeRobot metadata")


# --- episode records ------------------------------------------------------------------------------

@pytest.mark.parametrize(("column", "values", "match"), [
    ("episode_index", [-1, 1], r"file-000.parquet: episode_index=-1 must be an integer in \[0, 2147483648\)"),
    ("episode_index", [2**40, 1], r"episode_index=1099511627776 must be an integer"),
    ("episode_index", ["0", "1"], r"episode_index='0' must be an integer"),
    ("episode_index", [True, False], r"episode_index=True must be an integer"),
    ("episode_index", [1, 1], r"meta: episode_index 1 is listed twice"),
    ("length", [-3, 3], r"episode_index 0: length=-3 must be an integer"),
    ("length", [1.5, 3.0], r"episode_index 0: length=1.5 must be an integer"),
    ("data/chunk_index", [-1, 0], r"episode_index 0: data/chunk_index=-1 must be an integer"),
    ("data/file_index", [10**12, 0], r"episode_index 0: data/file_index=1000000000000 must be an integer"),
    ("videos/observation.images.front/file_index", [None, 0], r"videos/observation.images.front/file_index=None"),
    ("videos/observation.images.front/from_timestamp", [float("nan"), 0.3],
     r"episode_index 0: videos/observation.images.front/from_timestamp=nan must be a finite number of seconds"),
    ("videos/observation.images.front/from_timestamp", [-1.0, 0.3], r"from_timestamp=-1.0 must be a finite"),
    ("videos/observation.images.wrist/to_timestamp", [float("inf"), 0.6], r"to_timestamp=inf must be a finite"),
    ("videos/observation.images.wrist/to_timestamp", [0.3, 0.2],
     r"episode_index 1: videos/observation.images.wrist/to_timestamp=0.2 is before from_timestamp=0.3"),
    ("tasks", [[1], [2]], r"episode_index 0: tasks=\[1\] must be a list of strings"),
])
def test_bad_episode_records_are_refused_by_name(src, column, values, match):
    _set(src / META, column, values)
    _refused(src, match)


def test_a_from_timestamp_past_the_video_is_refused_before_seeking(src):
    _set(src / META, "videos/observation.images.front/from_timestamp", [1e6, 1e300])
    _set(src / META, "videos/observation.images.front/to_timestamp", [1e6 + 1, 1e300])
    _refused(src, r"episode 'episode_000000' camera 'observation.images.front' .*from_timestamp 1000000.000000s "
                  r"lies past the video's end at 0.6")


def test_unreadable_episode_parquet_names_the_file(src):
    (src / META).write_bytes(b"PAR1 not really")
    _refused(src, r"meta/episodes/chunk-000/file-000.parquet: cannot read the parquet file")


@pytest.mark.parametrize(("line", "match"), [
    ("{", r"meta/episodes.jsonl line 2: invalid JSON"),
    ("[" * 100_000, r"meta/episodes.jsonl line 2: JSON nested too deeply"),
    ("[1]", r"meta/episodes.jsonl line 2: expected a JSON object per line"),
    ('{"episode_index": -1, "length": 3}', r"line 2: episode_index=-1 must be an integer"),
    ('{"episode_index": 1, "length": "3"}', r"line 2 \(episode_index 1\): length='3' must be an integer"),
    ('{"episode_index": 0, "length": 3}', r"meta: episode_index 0 is listed twice"),
])
def test_bad_v21_episode_lines_are_refused_by_name(tmp_path, line, match):
    src = tmp_path / "lr"
    make_lerobot(src, num_episodes=2, length=3, height=32, width=48, version="v2.1", image_feature=False,
                 encoder=available_encoders(("h264",))[0])
    (tmp_path / "outside").mkdir()
    path = src / "meta/episodes.jsonl"
    path.write_text(path.read_text().splitlines()[0] + "\n" + line + "\n")
    _refused(src, match)


@pytest.mark.parametrize("size", [0, -1, True, "1000"])
def test_bad_v21_chunks_size_is_refused(tmp_path, size):
    src = tmp_path / "lr"
    make_lerobot(src, num_episodes=1, length=3, height=32, width=48, version="v2.1", image_feature=False,
                 encoder=available_encoders(("h264",))[0])
    (tmp_path / "outside").mkdir()
    _info(src, chunks_size=size)
    _refused(src, rf"meta/info.json: chunks_size={size!r} must be an integer in \[1, ")


# --- data rows -------------------------------------------------------------------------------------

@pytest.mark.parametrize(("column", "values", "match"), [
    ("frame_index", [0, 1, 1, 0, 1, 2], r"episode 'episode_000000': .*file-000.parquet: frame_index is not 0..2 "
                                        r"\(type int64, row 2 holds 1\)"),
    ("frame_index", [1, 2, 3, 0, 1, 2], r"frame_index is not 0..2 \(type int64, row 0 holds 1\)"),
    ("frame_index", [0.0, 1.0, 2.0, 0.0, 1.0, 2.0], r"frame_index is not 0..2 \(type double\)"),
    ("timestamp", [0.0, float("nan"), 0.2, 0, 0.1, 0.2], r"file-000.parquet: row 1 has timestamp nan"),
    ("timestamp", [0.0, -0.1, 0.2, 0, 0.1, 0.2], r"row 1 has timestamp -0.1"),
    ("timestamp", ["0", "1", "2", "0", "1", "2"], r"timestamp column is string"),
    ("action", [[1.0], [1.0, 2.0], [1.0]] * 2, r"feature 'action': rows hold lists of 1 to 2 values"),
    ("action", [["a"]] * 6, r"feature 'action': the column holds string, not the numbers"),
])
def test_bad_data_rows_are_refused_by_name(src, column, values, match):
    _set(src / DATA, column, values)
    _refused(src, match)


def test_unreadable_data_parquet_names_the_file(src):
    (src / DATA).write_bytes(b"\0" * 100)
    _refused(src, r"episode 'episode_000000': .*data/chunk-000/file-000.parquet: cannot read the parquet file")


def test_video_suffix_outside_the_known_containers_is_refused(src):
    _info(src, video_path="videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.m3u8")
    for key in ("front", "wrist"):
        d = src / f"videos/observation.images.{key}/chunk-000"
        (d / "file-000.mp4").rename(d / "file-000.m3u8")
    _refused(src, r"camera 'observation.images.front' .*video_path gives a .m3u8 file; LeRobot videos are .mp4")


def test_the_demuxer_comes_from_the_suffix_not_the_bytes(src):
    # bytes choosing the demuxer is how an "mp4" holding a playlist gets to open the files it lists
    import av

    mkv = src / "remuxed.mkv"
    with av.open(str(src / FRONT)) as i, av.open(str(mkv), "w", format="matroska") as o:
        stream = o.add_stream_from_template(i.streams.video[0])
        for packet in i.demux(i.streams.video[0]):
            if packet.dts is not None:
                packet.stream = stream
                o.mux(packet)
    mkv.replace(src / FRONT)
    _refused(src, r"camera 'observation.images.front' .*file-000.mp4\): cannot decode the video")


# --- the CLI: one line, exit 2, and --tolerance-s --------------------------------------------------

def _cli(src: Path, out: Path, capsys, *args: str) -> tuple[int, str]:
    codes = []
    assert _watching(src, lambda: codes.append(cli.main(["write", str(src), str(out), "--workers", "1", *args])),
                     out) == []
    return codes[0], capsys.readouterr().err


@pytest.mark.parametrize(("craft", "match"), [
    (lambda s: _info(s, data_path="{chunk_index.__init__.__globals__}"), "data_path="),
    (lambda s: _info(s, fps=float("inf")), "fps=inf must be a finite number"),
    (lambda s: _info(s, raw="[" * 100_000), "meta/info.json: JSON nested too deeply"),
    (lambda s: _info(s, raw='{"codebase_version": "v3.0", "fps": 10'), "meta/info.json: invalid JSON"),
    (lambda s: _link(s / DATA, s.parent / "outside/secret.parquet"), "outside the dataset root"),
    (lambda s: _set(s / META, "length", [2**31, 3]), "length=2147483648 must be an integer"),
])
def test_cli_gives_one_line_and_exit_2(src, tmp_path, capsys, craft, match):
    craft(src)
    code, err = _cli(src, tmp_path / "out", capsys)
    assert code == 2
    assert err.count("\n") == 1 and "Traceback" not in err and match in err, err


def test_shard_script_exits_2_without_a_traceback(src, tmp_path):
    _info(src, video_path="{video_key.__class__.__mro__}")
    done = subprocess.run([sys.executable, str(REPO / "scripts/shard.py"), "write", str(src), str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.startswith("episodepipes-shard: error: ") and done.stderr.count("\n") == 1, done.stderr
    assert "video_path='{video_key.__class__.__mro__}' uses {video_key.__class__.__mro__}" in done.stderr


def _jitter(src: Path, seconds: float) -> None:
    t = pq.read_table(src / DATA)
    times = t.column("timestamp").to_numpy() + np.float32(seconds)
    _set(src / DATA, "timestamp", times.astype(np.float32))


def test_cli_tolerance_s_reaches_the_reader(src, tmp_path, capsys):
    _jitter(src, 0.003)  # rows 3 ms off their frames: refused at LeRobot's 1e-4 s, fine at 5 ms
    code, err = _cli(src, tmp_path / "strict", capsys)
    assert code == 2 and "tolerance_s=0.0001" in err and "--tolerance-s" in err, err
    code, _ = _cli(src, tmp_path / "loose", capsys, "--tolerance-s", "0.005")
    assert code == 0
    from episodepipes.index import EpisodeIndex

    assert len(pq.read_table(src / DATA)) == EpisodeIndex.open(tmp_path / "loose").frames


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "-inf"])
def test_cli_refuses_a_tolerance_that_is_not_finite_and_positive(src, tmp_path, capsys, value):
    code, err = _cli(src, tmp_path / "out", capsys, f"--tolerance-s={value}")
    assert code == 2 and err.count("\n") == 1 and "must be a finite number of seconds > 0 (--tolerance-s" in err, err
    assert not (tmp_path / "out").exists()


def test_cli_tolerance_s_is_documented_and_lerobot_only(src, tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli.main(["write", "--help"])
    assert "--tolerance-s S" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        cli.main(["write", str(src), str(tmp_path / "out"), "--tolerance-s", "soon"])
    assert e.value.code == 2 and "--tolerance-s: invalid float value: 'soon'" in capsys.readouterr().err
    raw = tmp_path / "raw"
    shutil.copytree(src / "videos/observation.images.front/chunk-000", raw / "ep0")
    code = cli.main(["write", str(raw), str(tmp_path / "out"), "--format", "raw", "--tolerance-s", "0.01"])
    assert code == 2 and "--tolerance-s applies to LeRobot datasets only" in capsys.readouterr().err


def test_reader_refuses_a_bad_tolerance(src):
    for bad in (0, -1e-4, float("nan"), float("inf"), True, "0.1"):
        with pytest.raises(ValueError, match=r"tolerance_s=.* must be a finite number of seconds > 0"):
            LeRobotReader(src, tolerance_s=bad)


@pytest.mark.parametrize("version", ["v2.1", "v3.0"])
@pytest.mark.parametrize("copy", [False, True])
def test_an_mp4_with_more_or_fewer_frames_than_its_parquet_rows(tmp_path, version, copy):
    """Held (issue 23): an mp4 longer than its episode gives the rows' frames, found by timestamp as LeRobot finds
    them (the extra frames are never read); a shorter one is one line naming the episode, camera, file and row."""
    from episodepipes.sharding.write.encode import EncodeOptions, encode_episode

    enc = available_encoders(("h264",))[0]
    short, long = tmp_path / "short", tmp_path / "long"
    for root, n in ((short, 6), (long, 14)):
        make_lerobot(root, num_episodes=1, length=n, height=32, width=48, encoder=enc, version=version,
                     image_feature=False)
    for a, b in zip(sorted(short.rglob("*.mp4")), sorted(long.rglob("*.mp4"))):
        six, fourteen = a.read_bytes(), b.read_bytes()
        a.write_bytes(fourteen)  # short/ now has 14-frame videos, long/ 6-frame ones
        b.write_bytes(six)
    options = EncodeOptions(codec="copy") if copy else EncodeOptions()
    more = LeRobotReader(short, copy=copy)
    assert encode_episode(more.read("episode_000000"), options).meta["length"] == 6
    fewer = LeRobotReader(long, copy=copy)
    with pytest.raises(Exception, match=r"episode .episode_000000. camera .* row 6 .* has no frame") as e:
        encode_episode(fewer.read("episode_000000"), options)
    assert "\n" not in str(e.value) and type(e.value).__name__ == "EpisodeError"
