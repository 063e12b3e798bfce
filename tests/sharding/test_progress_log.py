"""The resume state's append-only log: a save appends the new shard's line, never rewrites what is saved."""

import hashlib
import json
import os

import pytest

from episodepipes.sharding.formats.synthetic import SyntheticReader
from episodepipes.sharding.write import WriteOptions, progress, write_shards
from episodepipes.sharding.write.progress import PROGRESS_LOG, PROGRESS_NAME

SYN = SyntheticReader(num_episodes=9, length=6, height=16, width=16, lengths=(6, 3, 8, 5, 6, 2, 7, 4, 6))
OPTS = WriteOptions(format="synthetic", shard_size=5_000)


class _Crash(RuntimeError):
    pass


class _Crashing(SyntheticReader):
    def read(self, episode_id):
        if episode_id == "ep0007":
            raise _Crash(episode_id)
        return super().read(episode_id)


def _crashed(out, **kw):
    with pytest.raises(_Crash):
        write_shards(_Crashing(**{k: getattr(SYN, k) for k in ("num_episodes", "length", "height", "width",
                                                                "lengths")}), out, OPTS, **kw)


def _files(d):
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file()}


@pytest.fixture
def ref(tmp_path):
    write_shards(SYN, tmp_path / "ref", OPTS)
    return _files(tmp_path / "ref")


def test_each_save_appends_one_record_and_the_progress_file_stays_small(tmp_path, monkeypatch):
    sizes, lines = [], []
    real = progress.Progress.save

    def save(self, out, *, append=True, upto=None):  # the state after every save, as a crash there would leave it
        real(self, out, append=append, upto=upto)
        saved = json.loads((out / PROGRESS_NAME).read_text())
        del saved["segments"]  # the episode in flight's finished segments: bounded by one episode
        sizes.append(len(json.dumps(saved)))
        lines.append((out / PROGRESS_LOG).read_bytes())

    monkeypatch.setattr(progress.Progress, "save", save)
    _crashed(tmp_path / "out", save_every=0)  # a save after every shard
    assert len(lines) > 4
    for before, after in zip(lines, lines[1:]):  # appended: every earlier byte kept, one record more
        assert after.startswith(before)
        head, _, payload = after[len(before):].partition(b"\n")
        sha, size, text = head.split(b" ", 2)
        assert int(size) == len(payload) and json.loads(text)["columns"] == ["offsets", "crc32"]
        assert len(payload) == 12 * sum(s["count"] for e in json.loads(text)["episodes"] for s in e["segments"])
    saved = json.loads((tmp_path / "out" / PROGRESS_NAME).read_text())
    assert "shards" not in saved and "episodes" not in saved
    assert max(sizes) - min(sizes) < 40  # the cursor and counts only: not growing with the shards
    prog = progress.read(tmp_path / "out")
    assert len(prog["shards"]) == len(lines) - 1 and prog["log"]["bytes"] == len(lines[-1])


def test_a_torn_log_tail_is_cut_and_the_write_resumes_to_the_same_bytes(tmp_path, ref):
    _crashed(tmp_path / "out")
    with open(tmp_path / "out" / PROGRESS_LOG, "ab") as f:
        f.write(b"0123 {\"shards\": [half of a line")  # a crash after an append, before the progress named it
    assert write_shards(SYN, tmp_path / "out", OPTS).resumed
    assert _files(tmp_path / "out") == ref


def test_an_old_progress_file_with_everything_inline_still_resumes(tmp_path, ref):
    _crashed(tmp_path / "out")
    old = progress.read(tmp_path / "out")
    del old["log"]
    (tmp_path / "out" / PROGRESS_NAME).write_text(json.dumps(old))  # as older episodepipes wrote it
    os.unlink(tmp_path / "out" / PROGRESS_LOG)
    assert write_shards(SYN, tmp_path / "out", OPTS).resumed
    assert _files(tmp_path / "out") == ref


def test_a_log_of_json_lines_as_the_first_logs_held_still_resumes(tmp_path, ref):
    _crashed(tmp_path / "out")
    prog = progress.read(tmp_path / "out")  # every value inline
    text = json.dumps({k: prog[k] for k in ("shards", "episodes", "stats_log")}).encode()
    line = hashlib.sha256(text).hexdigest().encode() + b" " + text + b"\n"
    (tmp_path / "out" / PROGRESS_LOG).write_bytes(line)
    saved = json.loads((tmp_path / "out" / PROGRESS_NAME).read_text())
    saved["log"]["bytes"] = len(line)
    (tmp_path / "out" / PROGRESS_NAME).write_text(json.dumps(saved))
    assert progress.read(tmp_path / "out")["episodes"] == prog["episodes"]
    assert write_shards(SYN, tmp_path / "out", OPTS).resumed
    assert _files(tmp_path / "out") == ref


@pytest.mark.parametrize(("damage", "message"), [
    (lambda b: b[:10] + bytes([b[10] ^ 1]) + b[11:], "line 1 does not match its sha256"),
    (lambda b: b[:-20], "fewer than the"),
    (lambda b: b[:-30] + bytes([b[-30] ^ 1]) + b[-29:], r"line \d+ does not match its sha256"),  # in a payload
])
def test_a_damaged_log_is_refused_by_name_and_nothing_is_deleted(tmp_path, damage, message):
    _crashed(tmp_path / "out")
    log = tmp_path / "out" / PROGRESS_LOG
    log.write_bytes(damage(log.read_bytes()))
    before = sorted((p.name, p.stat().st_size) for p in (tmp_path / "out").iterdir())
    with pytest.raises(ValueError, match=rf"{log}.*{message}.*pass --overwrite to start over$"):
        write_shards(SYN, tmp_path / "out", OPTS)
    assert sorted((p.name, p.stat().st_size) for p in (tmp_path / "out").iterdir()) == before


def test_crafted_log_counts_are_refused(tmp_path):
    _crashed(tmp_path / "out")
    saved = json.loads((tmp_path / "out" / PROGRESS_NAME).read_text())
    saved["log"]["shards"] += 1
    (tmp_path / "out" / PROGRESS_NAME).write_text(json.dumps(saved))
    with pytest.raises(ValueError, match=r"_progress.log holds \d+ shards and \d+ episodes, _progress.json records"):
        write_shards(SYN, tmp_path / "out", OPTS)
    saved["log"] = {"bytes": -1}
    (tmp_path / "out" / PROGRESS_NAME).write_text(json.dumps(saved))
    with pytest.raises(ValueError, match=r"_progress.json is damaged \(log should be"):
        write_shards(SYN, tmp_path / "out", OPTS)
