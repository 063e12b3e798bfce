"""Crafted v1 index.json files: every field is checked at open, named in one line, and nothing escapes the folder.

(v2 indexes and their columns: tests/test_index_v2.py.)"""

import contextlib
import json
import math
import os
import shutil
import sys
from pathlib import Path

import pytest
from helpers import as_v1, make_shards

from episodepipes.index import EpisodeIndex, IndexFormatError


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    return as_v1(make_shards(tmp_path_factory.mktemp("good") / "s", num_episodes=3, length=6, height=16, width=24,
                             shard_size=20_000))


def _ep(d, k=0):
    return d["episodes"][k]


def _seg(d, k=0):
    return d["episodes"][k]["segments"][0]


def _set(get, key, value):
    def change(d):
        get(d)[key] = value
    return change


def _cam(d):
    return next(iter(_ep(d)["cameras"].values()))


def _arr(d):
    return _ep(d)["arrays"]["state"]


CASES = {
    # shard list
    "pipe name": (_set(lambda d: d["shards"][0], "name", "pipe:touch pwned; cat shard-000000.tar"), "name="),
    "parent name": (_set(lambda d: d["shards"][0], "name", "../x.tar"), "name="),
    "absolute name": (_set(lambda d: d["shards"][0], "name", "/etc/passwd"), "name="),
    "nested name": (_set(lambda d: d["shards"][0], "name", "sub/shard-000000.tar"), "name="),
    "url name": (_set(lambda d: d["shards"][0], "name", "http://host/shard-000000.tar"), "name="),
    "dash name": (_set(lambda d: d["shards"][0], "name", "-shard-000000.tar"), "name="),
    "name not a str": (_set(lambda d: d["shards"][0], "name", 7), "name="),
    "duplicate name": (lambda d: d["shards"][1].update(name=d["shards"][0]["name"]), "appears twice"),
    "bytes negative": (_set(lambda d: d["shards"][0], "bytes", -1), "bytes=-1"),
    "bytes bool": (_set(lambda d: d["shards"][0], "bytes", True), "bytes=True"),
    "bytes str": (_set(lambda d: d["shards"][0], "bytes", "100"), "bytes='100'"),
    "sha256 not hex": (_set(lambda d: d["shards"][0], "sha256", "../../etc"), "sha256="),
    "samples disagree": (lambda d: d["shards"][0].update(samples=d["shards"][0]["samples"] + 1), "samples="),
    "shards not a list": (lambda d: d.update(shards={"a": 1}), "shards should be a list"),
    # episode fields
    "fps zero": (_set(_ep, "fps", 0), "fps=0"),
    "fps negative": (_set(_ep, "fps", -10.0), "fps=-10.0"),
    "fps bool": (_set(_ep, "fps", True), "fps=True"),
    "fps string": (_set(_ep, "fps", "fast"), "fps='fast'"),
    "fps infinite": (_set(_ep, "fps", math.inf), "fps=inf"),
    "fps nan": (_set(_ep, "fps", math.nan), "fps=nan"),
    "length bool": (_set(_ep, "length", True), "length=True"),
    "length float": (_set(_ep, "length", 6.0), "length=6.0"),
    "length zero": (_set(_ep, "length", 0), "length=0"),
    "length disagrees": (_set(_ep, "length", 7), "length=7"),
    "split not a str": (_set(_ep, "split", 1), "split=1"),
    "prompt not a str": (_set(_ep, "prompt", ["x"]), "prompt="),
    "id escapes": (_set(_ep, "id", "../evil"), "tar-safe episode id"),
    "id not a str": (_set(_ep, "id", 3), "id=3"),
    "duplicate id": (lambda d: _ep(d, 1).update(id=_ep(d)["id"]), "appears twice"),
    "episode not an object": (lambda d: d["episodes"].__setitem__(0, []), "expected an object"),
    # cameras and arrays
    "no cameras": (_set(_ep, "cameras", {}), "cameras should be a non-empty object"),
    "camera name unsafe": (lambda d: _ep(d)["cameras"].update({"../x": _cam(d)}), "tar-safe field name"),
    "height zero": (_set(_cam, "height", 0), "height=0"),
    "width bool": (_set(_cam, "width", True), "width=True"),
    "source height negative": (_set(_cam, "source_height", -4), "source_height=-4"),
    "dtype object": (_set(_arr, "dtype", "O"), "dtype='O'"),
    "dtype structured": (_set(_arr, "dtype", "f4,i4"), "dtype='f4,i4'"),
    "dtype void": (_set(_arr, "dtype", "V8"), "dtype='V8'"),
    "dtype stringdtype": (_set(_arr, "dtype", "T"), "dtype='T'"),
    "dtype unknown": (_set(_arr, "dtype", "float33"), "dtype='float33'"),
    "dtype not a str": (_set(_arr, "dtype", 4), "dtype=4"),
    "shape negative": (_set(_arr, "shape", [-1]), "shape="),
    "shape float": (_set(_arr, "shape", [7.0]), "shape="),
    "shape bool": (_set(_arr, "shape", [True]), "shape="),
    "shape huge": (_set(_arr, "shape", [2**40, 2**40]), "shape="),
    "shape not a list": (_set(_arr, "shape", "7"), "shape"),
    # segments
    "segment shard past the list": (_set(_seg, "shard", 99), "shard=99"),
    "segment shard negative": (_set(_seg, "shard", -1), "shard=-1"),
    "segment shard bool": (_set(_seg, "shard", False), "shard=False"),
    "segment first": (_set(_seg, "first", 1), "first=1"),
    "segment count zero": (_set(_seg, "count", 0), "count=0"),
    "offsets float": (lambda d: _seg(d)["offsets"].__setitem__(1, 512.5), "offsets"),
    "offsets str": (lambda d: _seg(d)["offsets"].__setitem__(1, "1024"), "offsets"),
    "offsets bool": (lambda d: _seg(d)["offsets"].__setitem__(0, False), "offsets"),
    "offsets negative": (lambda d: _seg(d)["offsets"].__setitem__(0, -512), "offsets"),
    "offsets decreasing": (lambda d: _seg(d)["offsets"].reverse(), "strictly increasing"),
    "offsets repeated": (lambda d: _seg(d)["offsets"].__setitem__(1, _seg(d)["offsets"][0]), "strictly increasing"),
    "offsets too few": (lambda d: _seg(d)["offsets"].pop(), "offsets has"),
    "end past the shard": (lambda d: _seg(d).update(end=d["shards"][0]["bytes"] + 1), "end="),
    "end before the last frame": (lambda d: _seg(d).update(end=_seg(d)["offsets"][-1]), "end="),
    "crc32 too large": (lambda d: _seg(d)["crc32"].__setitem__(0, 2**32), "crc32"),
    "crc32 negative": (lambda d: _seg(d)["crc32"].__setitem__(0, -1), "crc32"),
    "crc32 bool": (lambda d: _seg(d)["crc32"].__setitem__(2, True), "crc32"),
    "crc32 float": (lambda d: _seg(d)["crc32"].__setitem__(2, 5.0), "crc32"),
    "crc32 too few": (lambda d: _seg(d)["crc32"].pop(), "crc32 has"),
    "no segments": (_set(_ep, "segments", []), "segments is empty"),
    "segments out of order": (lambda d: _ep(d)["segments"].append(dict(_seg(d))), "shard="),
    # optional top-level fields
    "skipped not a list": (lambda d: d.update(skipped="x"), "skipped should be a list"),
    "skipped entry": (lambda d: d.update(skipped=[{"id": 1, "error": "e"}]), "skipped entry 0"),
    "shard size": (lambda d: d["options"].update(shard_size=0), "shard_size=0"),
    "options not an object": (lambda d: d.update(options=[]), "options should be a dict"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_crafted_field_is_refused_in_one_line_naming_file_and_field(good, tmp_path, case):
    change, needle = CASES[case]
    data = json.loads((good / "index.json").read_text())
    change(data)
    (tmp_path / "index.json").write_text(json.dumps(data))
    with pytest.raises(IndexFormatError) as e:
        EpisodeIndex.open(tmp_path)
    msg = str(e.value)
    assert msg.startswith(str(tmp_path / "index.json")) and "\n" not in msg, msg
    assert needle in msg and "re-shard" in msg, msg


def test_the_untouched_index_opens(good, tmp_path):
    data = json.loads((good / "index.json").read_text())
    (tmp_path / "index.json").write_text(json.dumps(data))
    assert len(EpisodeIndex.open(tmp_path).episodes) == 3


@pytest.mark.parametrize("text, needle", [
    ('{"format": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
    ('{"format": "episodepipes-shards", "version": 1,', "not valid JSON"),
    (b'{"format": "\xff\xfe"}', "not valid JSON"),
])
def test_unparseable_json_names_the_file(tmp_path, text, needle):
    path = tmp_path / "index.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(IndexFormatError) as e:
        EpisodeIndex.open(tmp_path)
    assert str(e.value).startswith(str(path)) and needle in str(e.value) and "\n" not in str(e.value)


def test_an_old_index_still_opens(good, tmp_path):
    # written before crc32, source sizes and full dtypes; with an int fps, as json may hold one
    data = json.loads((good / "index.json").read_text())
    for e in data["episodes"]:
        e["fps"] = 10
        for s in e["segments"]:
            del s["crc32"]
        for c in e["cameras"].values():
            del c["source_height"], c["source_width"]
        for a in e["arrays"].values():
            a["dtype"] = "float32"
    shutil.copytree(good, tmp_path / "s")
    (tmp_path / "s" / "index.json").write_text(json.dumps(data))
    idx = EpisodeIndex.open(tmp_path / "s", verify=True)
    assert idx.episodes[0].fps == 10.0 and idx.episodes[0].arrays["state"].dtype == "<f4"


_OPENED: list | None = None  # paths opened while a test records; the audit hook cannot be removed, so it checks this


def _audit(event, args):
    if _OPENED is None:
        return
    if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        _OPENED.append(os.path.abspath(os.fsdecode(args[0])))
    elif event in ("subprocess.Popen", "os.system", "os.posix_spawn", "os.exec", "os.spawn", "os.fork"):
        _OPENED.append(f"COMMAND {event} {args!r}")


sys.addaudithook(_audit)


@contextlib.contextmanager
def _recording():
    global _OPENED
    _OPENED = []
    try:
        yield _OPENED
    finally:
        _OPENED = None


def _hostile(good, tmp_path, name):
    """A copy of ``good`` whose shard 0 is called ``name``; its real file also sits where the name points."""
    root = shutil.copytree(good, tmp_path / "ds")
    shutil.copy(good / "shard-000000.tar", tmp_path / "x.tar")  # what '../x.tar' would read
    data = json.loads((root / "index.json").read_text())
    data["shards"][0]["name"] = name
    (root / "index.json").write_text(json.dumps(data))
    return root


@pytest.mark.parametrize("kind", ["pipe", "parent", "absolute"])
def test_a_crafted_shard_name_runs_nothing_and_opens_nothing_outside_the_folder(good, tmp_path, monkeypatch,
                                                                                capsys, kind):
    from episodepipes.pipes import metric_pipe
    from episodepipes.sharding.cli import main

    pwned = tmp_path / "pwned"
    name = {"pipe": f"pipe:touch {pwned}; cat shard-000000.tar", "parent": "../x.tar", "absolute": "/etc/passwd"}[kind]
    root = _hostile(good, tmp_path, name)
    monkeypatch.chdir(root)  # relative to the folder, as `metric_pipe('.')` run inside it
    next(iter(metric_pipe(good, frames_per_episode=2, batch_size=2, num_workers=1)))  # imports done, no recording
    main(["info", str(good)])
    attempts = {
        "metric_pipe('.')": lambda: next(iter(metric_pipe(".", frames_per_episode=2, batch_size=2, num_workers=1))),
        "EpisodeIndex.open('index.json')": lambda: EpisodeIndex.open("index.json"),
        "EpisodeIndex.open('.', verify=True)": lambda: EpisodeIndex.open(".", verify=True),
    }
    with _recording() as opened:
        for what, attempt in attempts.items():
            with pytest.raises(IndexFormatError, match=r"index\.json is damaged: shard 0: name="):
                attempt()
                pytest.fail(f"{what} accepted the shard name {name!r}")
        capsys.readouterr()
        for command in ("info", "verify"):
            assert main([command, "."]) == 2
            err = capsys.readouterr().err
            assert "name=" in err and "Traceback" not in err, err
    assert not pwned.exists()
    python = tuple({os.path.realpath(p) + os.sep for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)})
    # Python's own files (imports, package metadata) are not chosen by the data; everything else must be inside
    # (an editable install keeps its package metadata, *.egg-info, beside the source tree)
    outside = [p for p in opened if not p.startswith((str(root) + os.sep, *python))
               and not os.path.realpath(p).startswith(python)
               and not any(part.endswith((".egg-info", ".dist-info")) for part in Path(p).parts)]
    assert outside == [], outside  # no command event either: those are recorded as 'COMMAND ...'


def test_the_audit_hook_sees_opens_and_commands(tmp_path):
    import subprocess

    with _recording() as opened:
        (tmp_path / "f").write_text("x")
        subprocess.run(["true"], check=True)
    assert str(tmp_path / "f") in opened and any(p.startswith("COMMAND subprocess.Popen") for p in opened)


def test_a_v2_index_opens_only_its_own_fixed_files(good, tmp_path):
    from episodepipes.format import COLUMNS
    from episodepipes.sharding.upgrade import upgrade

    root = shutil.copytree(good, tmp_path / "ds")
    upgrade(root)
    data = json.loads((root / "index.json").read_text())
    data["columns"]["offset"]["file"] = "../x.npy"  # a file name in the data is not a field a reader takes
    (root / "index.json").write_text(json.dumps(data))
    with pytest.raises(IndexFormatError, match="columns 'offset'|column 'offset'"):
        EpisodeIndex.open(root)
    upgrade(shutil.copytree(good, tmp_path / "ok"))
    with _recording() as opened:
        EpisodeIndex.open(tmp_path / "ok", verify=True)
    mine = {"index.json", *(f for f, _, _ in COLUMNS.values()), *(s["name"] for s in data["shards"])}
    inside = {Path(p).name for p in opened if p.startswith(str(tmp_path / "ok") + os.sep)}
    assert inside and inside <= mine, inside - mine
    python = tuple({os.path.realpath(p) + os.sep for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)})
    assert [p for p in opened if not p.startswith((str(tmp_path / "ok") + os.sep, *python))] == []
