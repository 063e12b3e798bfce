"""Hostile statistics and resume state: the side file ``index.stats.bin`` and the index files beside it replaced by
FIFOs, devices, folders or sparse giants; side-file headers that claim memory-bomb counts; ``stats_file`` fields
that try to name another file; a resume's ``_progress.json`` and statistics log crafted field by field. Each is
refused in one line naming the file and the fix (the CLI: exit 2), never a hang, a MemoryError or a traceback,
and never a finished write with silently wrong episodes or statistics."""

import json
import shutil

import numpy as np
import pytest
from helpers import put_dev_zero, put_fifo, put_folder

from episodepipes.format import npy_bytes
from episodepipes.index import EpisodeIndex, IndexFormatError
from episodepipes.normstats import ArrayStats
from episodepipes.normstats import sidefile as statsfile
from episodepipes.sharding import cli
from episodepipes.sharding.formats.synthetic import SyntheticReader
from episodepipes.sharding.write import WriteOptions, progress, write_shards
from episodepipes.sharding.write.progress import PROGRESS_NAME, STATS_LOG

KW = {"num_episodes": 7, "length": 9, "height": 16, "width": 24, "lengths": (9, 5, 12, 7, 9, 3, 10)}
SYN = SyntheticReader(**KW)
OPTS = WriteOptions(format="synthetic", shard_size=20_000)
FIX = r"; recompute them: episodepipes-shard stats .* --recompute$"


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    out = tmp_path_factory.mktemp("hostile_stats") / "s"
    write_shards(SYN, out, OPTS)
    return out


@pytest.fixture
def copy(written, tmp_path):
    shutil.copytree(written, tmp_path / "s")
    return tmp_path / "s"


def _forge(d, raw):
    """Replace the side file with ``raw`` and make index.json vouch for it: a hostile pair, not a torn one."""
    (d / statsfile.NAME).write_bytes(raw)
    data = json.loads((d / "index.json").read_bytes())
    data.update(statsfile.descriptor(raw))
    (d / "index.json").write_text(json.dumps(data))


def _cli_fails(args, capsys, *needles):
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and all(n in err for n in needles), err


# --- the side file: what stands in its place -------------------------------------------------------------------

_fifo, _dev_zero, _folder = put_fifo, put_dev_zero, put_folder


def _sparse(p):
    with open(p, "wb") as f:
        f.truncate(1 << 40)  # a TiB that costs no disk: read whole, it is a MemoryError


@pytest.mark.parametrize("make", [_fifo, _dev_zero, _folder, _sparse])
def test_a_side_file_that_is_no_regular_file_of_its_size_is_refused_without_reading_it(copy, capsys, make):
    side = copy / statsfile.NAME
    side.unlink()
    make(side)
    index = EpisodeIndex.open(copy)  # opening never reads it
    want = "has 1099511627776 bytes or a sha256 that do not match" if make is _sparse else "is not a regular file"
    with pytest.raises(IndexFormatError, match=rf"^{side} {want}.*{FIX}") as e:
        index.stats("action")
    assert "\n" not in str(e.value)
    assert str(e.value) in index.problems()
    _cli_fails(["stats", str(copy)], capsys, str(side), "--recompute")


@pytest.mark.parametrize("name", ["index.json", "index.offset.npy"])
@pytest.mark.parametrize("make", [_fifo, _dev_zero, _folder])
def test_an_index_file_that_is_no_regular_file_is_refused_at_open(copy, capsys, name, make):
    (copy / name).unlink()
    make(copy / name)
    with pytest.raises(IndexFormatError, match=rf"^{copy / name} is not a regular file .*; restore"):
        EpisodeIndex.open(copy)
    _cli_fails(["info", str(copy)], capsys, str(copy / name))


def test_a_sparse_giant_index_is_refused_by_its_size(copy):
    with open(copy / "index.json", "r+b") as f:
        f.truncate(1 << 40)
    with pytest.raises(IndexFormatError, match=rf"^{copy / 'index.json'} holds 1099511627776 bytes, more than"):
        EpisodeIndex.open(copy)


# --- the side file's fields ------------------------------------------------------------------------------------

def _pack(arrays):
    return b"".join(npy_bytes(np.ascontiguousarray(a)) for a in arrays.values())


def _arrays(d):
    return dict(statsfile._read_arrays((d / statsfile.NAME).read_bytes(), where="test"))


def _header(edit):
    def go(a):
        head = json.loads(a["header"].tobytes())
        edit(head)
        return _pack(dict(a, header=np.frombuffer(json.dumps(head).encode(), np.uint8)))
    return go


def _entry(field, value):
    def edit(head):
        head["entries"][0][field] = value
    return edit


def _many_entries(head):
    """100,000 entries of 65,536 elements each: 6.5e9 elements (52 GB of minima alone) claimed by a few MB."""
    head["entries"] = [["train", f"k{i:07d}", [65536], 1] for i in range(10**5)]


def _unending(a):
    keys = a["keys"].copy()
    keys[-1] |= 0x80  # the last varint never ends
    return _pack(dict(a, keys=keys))


def _min_above_max(a):
    lo, hi = a["min"].copy(), a["max"].copy()
    lo[0], hi[0] = hi[0] + 1, lo[0]
    return _pack(dict(a, min=lo, max=hi))


HEADERS = [
    ("count 2**60", _header(_entry(3, 2**60)), "sketch counts should add up"),
    ("count 2**62", _header(_entry(3, 2**62)), "count \\(a non-negative int\\)"),
    ("count -1", _header(_entry(3, -1)), "count \\(a non-negative int\\)"),
    ("count 1.0", _header(_entry(3, 12.0)), "count \\(a non-negative int\\)"),
    ("count true", _header(_entry(3, True)), "count \\(a non-negative int\\)"),
    ("shape 1e3", _header(_entry(2, [1e3])), "shape \\(at most 8 positive"),
    ("shape huge", _header(_entry(2, [2**40])), "shape \\(at most 8 positive"),
    ("split not text", _header(_entry(0, None)), "header entries should be sorted"),
    ("100k entries", _header(_many_entries), "array 'min' has \\d+ values, the header's entries need 6553600000"),
    ("varint never ends", _unending, "array 'keys' is not a sequence of canonical LEB128"),
    ("min above max", _min_above_max, "element 0 has inconsistent sum, sumsq, min and max"),
]


@pytest.mark.parametrize(("name", "forge", "message"), HEADERS, ids=[h[0] for h in HEADERS])
def test_a_side_file_claiming_what_it_does_not_hold_is_refused_by_field(copy, capsys, name, forge, message):
    _forge(copy, forge(_arrays(copy)))
    with pytest.raises(IndexFormatError, match=rf"^{copy / statsfile.NAME}: .*{message}.*{FIX}") as e:
        EpisodeIndex.open(copy).stats("action")
    assert "\n" not in str(e.value)
    _cli_fails(["stats", str(copy)], capsys, statsfile.NAME)


def test_an_entry_of_no_steps_is_a_key_error_naming_the_file(copy):
    """A consistent file may carry an entry no episode has the key of (count 0): asked for, it names the file."""
    table, missing = statsfile.decode((copy / statsfile.NAME).read_bytes(), where="test")
    stats = {(s, k): table.get(k, split=s) for s, k in table.keys()}
    stats[("train", "ghost")] = ArrayStats((2,))
    _forge(copy, statsfile.encode(stats, missing))
    index = EpisodeIndex.open(copy)
    with pytest.raises(KeyError, match=rf"{copy / 'index.json'} has no statistics for 'ghost' in split 'train': "
                                       "they count no steps"):
        index.stats("ghost")
    assert index.stats("action")["count"] == sum(n for n, e in zip(KW["lengths"], _splits()) if e == "train")


def _splits():
    return [SYN.read(e).split for e in SYN.episode_ids()]


@pytest.mark.parametrize("desc", [
    {"bytes": 10, "sha256": "0" * 64, "name": "../../etc/passwd"},
    {"bytes": 10.0, "sha256": "0" * 64},
    {"bytes": True, "sha256": "0" * 64},
    {"bytes": 2**40, "sha256": "0" * 64},
    {"bytes": 10, "sha256": "A" * 64},
    {"bytes": 10, "sha256": "/abs/path"},
    "index.stats.bin",
    None,
])
def test_a_stats_file_field_naming_another_file_or_an_odd_size_is_refused(copy, capsys, desc):
    data = json.loads((copy / "index.json").read_bytes())
    data["stats_file"] = desc
    (copy / "index.json").write_text(json.dumps(data))
    with pytest.raises(IndexFormatError, match=r"index.json: stats_file should be \{'bytes': a positive int, "
                                               rf"'sha256': 64 hex digits\}}{FIX}"):
        EpisodeIndex.open(copy).stats("action")
    _cli_fails(["stats", str(copy)], capsys, "stats_file")


# --- a resume's progress file and statistics log --------------------------------------------------------------

class _Crashing(SyntheticReader):
    def read(self, episode_id):
        if episode_id == "ep0005":
            raise RuntimeError(episode_id)
        return super().read(episode_id)


@pytest.fixture(scope="module")
def crashed(tmp_path_factory):
    """An interrupted write: 5 finished episodes' worth of shards, progress and statistics log."""
    out = tmp_path_factory.mktemp("crashed") / "out"
    with pytest.raises(RuntimeError, match="ep0005"):
        write_shards(_Crashing(**KW), out, OPTS)
    return out


@pytest.fixture
def unfinished(crashed, tmp_path):
    shutil.copytree(crashed, tmp_path / "out")
    return tmp_path / "out"


def _edit_progress(out, edit):
    p = progress.read(out)  # the logged shards and episodes inline: written back as an older episodepipes wrote it
    del p["log"]
    edit(p)
    (out / PROGRESS_NAME).write_text(json.dumps(p))


def _set(**fields):
    return lambda p: p.update(fields)


def _first(key, field, value):
    return lambda p: p[key][0].update({field: value})


PROGRESS = [
    ("shards a string", _set(shards="abc"), "shards should be a list"),
    ("shard name climbs", _first("shards", "name", "../../etc/passwd"), "name='../../etc/passwd' is not a shard"),
    ("shard name out of order", _first("shards", "name", "shard-000099.tar"), "should be 'shard-000000.tar'"),
    ("shard bytes float", _first("shards", "bytes", 1e3), "bytes=1000.0 should be an integer"),
    ("position float", _set(position=1.0), "position=1.0 should be an integer"),
    ("position negative", _set(position=-1), "position=-1 should be an integer >= 0"),
    ("position ahead", _set(position=10**6), "position=1000000 should follow the"),
    ("frame negative", _set(frame=-3), "frame=-3 should be an integer >= 0"),
    ("frame off its segments", lambda p: p.update(frame=p["frame"] + 1), "the segments hold"),
    ("episodes an object", _set(episodes={}), "episodes should be a list"),
    ("episode length text", _first("episodes", "length", "x"), "length='x' should be an integer >= 1"),
    ("episode twice", lambda p: p["episodes"].insert(1, p["episodes"][0]), "ep0000"),
    ("episode offset past the shard", lambda p: p["episodes"][0]["segments"][0].update(end=10**9),
     "within the shard's"),
    ("skipped entry an int", _set(skipped=[1]), "skipped entry 0: expected an object"),
    ("splits a list", _set(splits=[1]), "splits should be an object"),
]


@pytest.mark.parametrize(("name", "edit", "message"), PROGRESS, ids=[c[0] for c in PROGRESS])
def test_a_crafted_progress_file_is_refused_before_anything_resumes(unfinished, name, edit, message):
    _edit_progress(unfinished, edit)
    before = sorted((p.name, p.stat().st_size) for p in unfinished.iterdir())
    with pytest.raises(ValueError, match=rf"^{unfinished / PROGRESS_NAME} is damaged: .*{message}.*; pass "
                                         "--overwrite to start over$") as e:
        write_shards(SYN, unfinished, OPTS)
    assert "\n" not in str(e.value)
    assert sorted((p.name, p.stat().st_size) for p in unfinished.iterdir()) == before  # nothing deleted or cut


def test_a_statistics_log_that_repeats_a_record_is_refused_at_resume(unfinished, written):
    """The log and the progress both list the first record twice: every sha256 matches, the sums do not."""
    p = progress.read(unfinished)
    log = (unfinished / STATS_LOG).read_bytes()
    (unfinished / STATS_LOG).write_bytes(log[:p["stats_log"][0]["bytes"]] + log)
    _edit_progress(unfinished, lambda p: p.update(stats_log=[p["stats_log"][0], *p["stats_log"]]))
    with pytest.raises(ValueError, match=rf"^{unfinished / PROGRESS_NAME} \(its saved statistics\): "
                                         r"stats\['train'\]\['\w+'\] count=\d+, but the finished train episodes "
                                         r"with '\w+' have \d+ steps; the progress file is damaged: pass "
                                         "--overwrite to start over$"):
        write_shards(SYN, unfinished, OPTS)
    assert not (unfinished / "index.json").exists()  # no index with statistics it would then refuse


@pytest.mark.parametrize("make", [_fifo, _dev_zero])
def test_a_statistics_log_that_is_no_regular_file_is_refused_at_resume(unfinished, make):
    (unfinished / STATS_LOG).unlink()
    make(unfinished / STATS_LOG)
    with pytest.raises(ValueError, match=rf"^{unfinished / STATS_LOG} is not a regular file .*--overwrite"):
        write_shards(SYN, unfinished, OPTS)


def test_a_stray_shard_like_file_is_left_alone_and_the_write_resumes(unfinished, written):
    (unfinished / "shard-abc.tar").write_bytes(b"not ours")
    assert write_shards(SYN, unfinished, OPTS).resumed
    assert (unfinished / "shard-abc.tar").read_bytes() == b"not ours"
    assert (unfinished / "index.json").read_bytes() == (written / "index.json").read_bytes()


@pytest.mark.parametrize(("make", "message"), [
    (_fifo, "is not a regular file"),
    (lambda p: p.write_text("[" * 100_000 + "]" * 100_000), "is damaged"),
    (lambda p: p.write_text("9" * 5000), r"is damaged \(.*digits"),
    (lambda p: p.write_bytes(b"\xff\xfe"), "is damaged"),
])
def test_a_progress_file_that_cannot_be_read_is_refused_without_blocking(unfinished, make, message):
    (unfinished / PROGRESS_NAME).unlink()
    make(unfinished / PROGRESS_NAME)
    with pytest.raises(ValueError, match=rf"^{unfinished / PROGRESS_NAME} {message}.*pass --overwrite to start over$"):
        write_shards(SYN, unfinished, OPTS)


def test_progress_options_that_are_no_object_are_refused(unfinished):
    _edit_progress(unfinished, _set(options=[1]))
    with pytest.raises(ValueError, match=r"_progress.json is damaged \(options should be an object\)"):
        write_shards(SYN, unfinished, OPTS)
