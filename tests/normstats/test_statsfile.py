"""The statistics side file ``index.stats.bin``: never read at open, read whole and checked on first use and by
verify, hostile files refused in one line naming the file and the fix, locally and from S3."""

import io
import json

import numpy as np
import pytest

from episodepipes.format import COLUMNS, npy_bytes
from episodepipes.index import EpisodeIndex, IndexFormatError
from episodepipes.normstats import ArrayStats
from episodepipes.normstats import _leb128 as leb128
from episodepipes.normstats import sidefile as statsfile
from episodepipes.normstats.fields import StatsFields, episode_part
from episodepipes.sharding import cli
from episodepipes.sharding.formats.synthetic import SyntheticReader
from episodepipes.sharding.write import WriteOptions, write_shards
from episodepipes.sharding.write.progress import STATS_LOG, Progress
from episodepipes.sharding.write.progress_stats import StatsLog, read_log

SYN = SyntheticReader(num_episodes=5, length=9, height=16, width=24, lengths=(9, 5, 12, 7, 3))
OPTS = WriteOptions(format="synthetic", shard_size=20_000)
FIX = r"; recompute them: episodepipes-shard stats .* --recompute$"


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    out = tmp_path_factory.mktemp("statsfile") / "s"
    write_shards(SYN, out, OPTS)
    return out


def _copy(src, dst):
    dst.mkdir()
    for p in src.iterdir():
        (dst / p.name).write_bytes(p.read_bytes())
    return dst


def _arrays(d):
    return dict(statsfile._read_arrays((d / statsfile.NAME).read_bytes(), where="test"))


def _forge(d, raw):
    """Replace the side file with ``raw`` and make index.json vouch for it: a hostile pair, not a torn one."""
    (d / statsfile.NAME).write_bytes(raw)
    data = json.loads((d / "index.json").read_bytes())
    data.update(statsfile.descriptor(raw))
    (d / "index.json").write_text(json.dumps(data))


def _pack(arrays):
    return b"".join(npy_bytes(np.ascontiguousarray(a)) for a in arrays.values())


def test_an_open_reads_no_statistics_and_the_first_stats_call_reads_them_whole(written, tmp_path):
    d = _copy(written, tmp_path / "s")
    want = EpisodeIndex.open(d).stats("action")
    (d / statsfile.NAME).unlink()
    index = EpisodeIndex.open(d)  # without the side file: nothing at open needs it
    assert len(index.episodes) == 5 and index.frames == sum(SYN.lengths)
    with pytest.raises(IndexFormatError, match=rf"^{d / statsfile.NAME} is missing, and .*index.json needs it{FIX}"):
        index.stats("action")
    assert any(statsfile.NAME in line and "--recompute" in line for line in index.problems())
    assert cli.main(["stats", str(d), "--recompute"]) == 0
    got = EpisodeIndex.open(d).stats("action")
    assert all(np.array_equal(got[k], want[k]) for k in want)


def test_the_side_file_is_deterministic_and_reads_back_to_equal_statistics():
    rng = np.random.default_rng(3)
    fields = StatsFields()
    for n, split in enumerate(("train", "val", "train")):
        arrays = {"a": rng.standard_normal((50, 3)) * 10.0 ** n, "b": rng.integers(-9, 9, (20, 2, 2)),
                  "c": np.array([[np.nan]])}
        fields.add(split, *episode_part(f"e{n}", arrays))
    raw = statsfile.encode(fields.stats, fields.missing)
    table, missing = statsfile.decode(raw, where="x")
    assert missing == fields.missing and missing[("train", "c")].endswith("fix or drop them before writing")
    assert all(table.get(k, split=s) == fields.stats[(s, k)] for s, k in table.keys())
    assert sorted(table.keys()) == sorted(fields.stats)
    for s, k in (("train", "a"), ("val", "b")):
        got, want = table.get(k, split=s).summary(), fields.stats[(s, k)].summary()
        assert all(np.array_equal(got[f], want[f]) for f in want)  # quantiles from arrays equal those from dicts
    assert statsfile.encode({(s, k): table.get(k, split=s) for s, k in table.keys()}, missing) == raw
    empty = ArrayStats((2,))  # an entry without steps (a split of empty episodes) reads back too
    assert statsfile.decode(statsfile.encode({("val", "e"): empty}, {}), where="x")[0].get("e", split="val") == empty


def test_leb128_round_trips_every_width_and_refuses_what_it_never_writes():
    v = np.array([0, 1, 127, 128, 300, 2**14 - 1, 2**14, 2**35 + 7, 2**62, 2**63 - 1], np.int64)
    b = leb128.encode(v)
    assert len(b) == 1 + 1 + 1 + 2 + 2 + 2 + 3 + 6 + 9 + 9
    assert np.array_equal(leb128.decode(b, "x", "w"), v)
    for bad in ([0x80], [0x81, 0x00], [0xFF] * 9 + [0x01]):  # cut short, a zero top byte, over 63 bits
        with pytest.raises(ValueError, match="w: array 'x' is not a sequence of canonical LEB128"):
            leb128.decode(np.array(bad, np.uint8), "x", "w")


def test_the_side_file_is_compact(written):
    table, _ = EpisodeIndex.open(written).load_stats()
    as_json = json.dumps(table.to_json(), sort_keys=True, separators=(",", ":")).encode()
    assert len((written / statsfile.NAME).read_bytes()) < len(as_json) / 2


def _edit(name, fn):
    def go(a):
        a[name] = fn(a[name].copy())
        return _pack(a)
    return go


def _shaped(n):
    def go(a):
        buf = io.BytesIO()
        np.lib.format.write_array_header_1_0(buf, {"descr": "<f8", "fortran_order": False, "shape": (n,)})
        return _pack({"header": a["header"]}) + buf.getvalue() + b"\0" * 64
    return go


def _edit_values(name, fn):
    """Edit the values an LEB128 array holds, then encode them again."""
    def go(a):
        a[name] = leb128.encode(fn(leb128.decode(a[name], name, "test").copy()))
        return _pack(a)
    return go


def _set(i, v):
    def fn(x):
        x[i] = v
        return x
    return fn


def _pickled(a):
    buf = io.BytesIO()
    np.save(buf, np.array([{}], object), allow_pickle=True)
    items = list(a.items())  # nkeys is the eighth array
    return _pack(dict(items[:7])) + buf.getvalue() + _pack(dict(items[8:]))


def _high_zero_byte(a):
    """The first exact sum with a zero byte on top: the same value, not in its one encoding."""
    n = int(a["length"][0])
    a["length"] = a["length"].copy()
    a["length"][0] += 1
    a["blob"] = np.concatenate([a["blob"][:n], [0], a["blob"][n:]]).astype(np.uint8)
    return _pack(a)


def _other_count(a):
    """A consistent file whose train/action entry is val's: right in itself, wrong for the index."""
    table, missing = statsfile.decode(_pack(a), where="test")
    stats = {(s, k): table.get(k, split=s) for s, k in table.keys()}
    stats[("train", "action")] = stats[("val", "action")]
    return statsfile.encode(stats, missing)


HOSTILE = [
    ("truncated", lambda a: _pack(a)[:-3], r"array 'counts' declares \d+ values, more than the file holds"),
    ("trailing", lambda a: _pack(a) + b"\0" * 16, "16 bytes follow the last array"),
    ("huge shape", _shaped(2**40), r"array 'min' declares 1099511627776 values, more than the file holds"),
    ("negative shape", _shaped(-1), r"array 'min' is <f8 of shape \(-1,\), should be 1-D <f8"),
    ("NaN min", _edit("min", _set(0, np.nan)), "min and max should be finite"),
    ("float counts", _edit("counts", lambda x: np.full(len(x), np.nan)), r"array 'counts' is <f8 .* should be 1-D"),
    ("pickle", _pickled, r"array 'nkeys' is \|O .* should be 1-D <u4"),
    ("key out of range", _edit_values("keys", _set(0, 0)), r"sketch keys should stay in"),
    ("keys not increasing", _edit_values("keys", _set(1, 0)), "sketch keys should increase"),
    ("counts off", _edit_values("counts", _set(0, 200)), "sketch counts should add up"),
    ("counts fewer", _edit_values("counts", lambda x: x[:-1]), "keys and counts should have one value per bucket"),
    ("varint too long", _edit("keys", lambda x: np.full(len(x), 0xFF, np.uint8)),
     "array 'keys' is not a sequence of canonical LEB128 values"),
    ("not canonical", _high_zero_byte, "canonical form"),
    ("sum inconsistent", _edit("sign", lambda x: np.concatenate([x[:len(x) // 2], -x[len(x) // 2:]])),
     r"stats\['train'\]\['action'\]: element 0 has inconsistent sum"),
    ("header", lambda a: _pack(dict(a, header=np.frombuffer(b'{"format": 1}', np.uint8))),
     "the header should be a episodepipes-stats version 1 object"),
    ("count", _other_count, r"stats\['train'\]\['action'\] count=12, but the index's train episodes with "
     r"'action' have 24 steps"),
]


@pytest.mark.parametrize(("name", "forge", "message"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_a_hostile_side_file_is_refused_in_one_line_naming_it_and_the_fix(written, tmp_path, capsys, name, forge,
                                                                         message):
    d = _copy(written, tmp_path / "s")
    _forge(d, forge(_arrays(d)))
    index = EpisodeIndex.open(d)
    with pytest.raises(IndexFormatError, match=rf"^{d / statsfile.NAME}[:\s].*({message}).*{FIX}") as e:
        index.stats("action")
    assert "\n" not in str(e.value)
    assert [line for line in index.problems() if statsfile.NAME in line] == [str(e.value)]
    assert cli.main(["stats", str(d)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and statsfile.NAME in err and "--recompute" in err


@pytest.mark.parametrize("how", ["swapped", "torn"])
def test_a_side_file_that_does_not_match_the_index_is_refused_by_name(written, tmp_path, how):
    d = _copy(written, tmp_path / "s")
    other = tmp_path / "other"
    write_shards(SyntheticReader(num_episodes=5, length=9, height=16, width=24), other, OPTS)
    raw = (other / statsfile.NAME).read_bytes() if how == "swapped" else (d / statsfile.NAME).read_bytes()[:100]
    (d / statsfile.NAME).write_bytes(raw)
    with pytest.raises(IndexFormatError, match=rf"^{d / statsfile.NAME} has {len(raw)} bytes or a sha256 that do "
                                               rf"not match .*index.json's stats_file .*{FIX}"):
        EpisodeIndex.open(d).stats("action")
    with pytest.raises(IndexFormatError, match="stats_file"):
        EpisodeIndex.open(d, verify=True)
    data = json.loads((d / "index.json").read_bytes())
    data["stats_file"]["sha256"] = "../x"
    (d / "index.json").write_text(json.dumps(data))
    with pytest.raises(IndexFormatError, match=r"stats_file should be \{'bytes': a positive int"):
        EpisodeIndex.open(d).stats("action")


def test_a_progress_save_appends_only_the_episodes_folded_since_the_last_one(tmp_path):
    fields = StatsFields()
    saver = StatsLog(tmp_path, Progress(options={}), fields)
    fields.add("train", *episode_part("e0", {"a": np.ones((3, 2))}))
    first = saver.save()["stats_log"]
    size = (tmp_path / STATS_LOG).stat().st_size
    assert len(first) == 1 and first[0]["bytes"] == size
    assert saver.save()["stats_log"] == first and (tmp_path / STATS_LOG).stat().st_size == size  # nothing new
    fields.add("val", *episode_part("e1", {"a": np.zeros((2, 2)), "b": np.array([[np.inf]])}))
    second = saver.save()["stats_log"]
    raw = (tmp_path / STATS_LOG).read_bytes()
    assert second[:1] == first and second[1] == statsfile.descriptor(raw[size:])["stats_file"]
    assert read_log(tmp_path, second, where="p").to_json() == fields.to_json()
    resumed = StatsFields()  # an older progress file's statistics become the first record of a new log
    resumed.add_loaded(*statsfile.decode(statsfile.encode(fields.stats, fields.missing), where="t"))
    (tmp_path / "sub").mkdir()
    again = StatsLog(tmp_path / "sub", Progress(options={}), resumed)
    resumed.add("train", *episode_part("e2", {"a": np.full((4, 2), 3.0)}))
    fields.add("train", *episode_part("e2", {"a": np.full((4, 2), 3.0)}))
    assert read_log(tmp_path / "sub", again.save()["stats_log"], where="p").to_json() == fields.to_json()


BUCKET = "stats"


def test_a_remote_root_reads_the_side_file_on_first_use_only(written, moto, proxy, tmp_path):
    moto.upload_dir(written, BUCKET, "ok")
    url = f"s3://{BUCKET}/ok"
    proxy.reset()
    remote = EpisodeIndex.open(url)
    assert [r[1] for r in proxy.gets()] == [f"/{BUCKET}/ok/{n}" for n in
                                            ["index.json", *(COLUMNS[c][0] for c in remote.meta["columns"])]]
    proxy.reset()
    got, want = remote.stats("state", split="val"), EpisodeIndex.open(written).stats("state", split="val")
    assert all(np.array_equal(got[k], want[k]) for k in want)
    remote.stats("action")  # read once, then served from memory
    assert [r[1] for r in proxy.gets()] == [f"/{BUCKET}/ok/{statsfile.NAME}"]
    bad = _copy(written, tmp_path / "bad")
    (bad / statsfile.NAME).write_bytes((bad / statsfile.NAME).read_bytes()[:-1])
    moto.upload_dir(bad, BUCKET, "bad")
    with pytest.raises(IndexFormatError, match=rf"^s3://{BUCKET}/bad/{statsfile.NAME} has \d+ bytes .*{FIX}"):
        EpisodeIndex.open(f"s3://{BUCKET}/bad").stats("action")
