"""Normalization statistics written by `write_shards`, merged by `merge_jobs`, served by `EpisodeIndex.stats`,
printed and recomputed by ``episodepipes-shard stats``, and used end to end by `Normalize`."""

import json

import numpy as np
import pytest
import torch

from episodepipes.index import EpisodeIndex, IndexFormatError
from episodepipes.normstats import QUANTILES, REL_ERROR
from episodepipes.normstats import sidefile as statsfile
from episodepipes.normstats.fields import StatsFields
from episodepipes.normstats.sidefile import NAME as STATS_NAME
from episodepipes.pipes.normalize import Normalize
from episodepipes.pipes.train import train_pipe
from episodepipes.sharding import cli
from episodepipes.sharding.formats.synthetic import SyntheticReader
from episodepipes.sharding.merge import merge_jobs
from episodepipes.sharding.write import WriteOptions, progress, write_shards
from episodepipes.sharding.write.progress import PROGRESS_NAME, STATS_LOG
from episodepipes.sharding.write.progress_stats import read_log

SYN = SyntheticReader(num_episodes=7, length=9, height=32, width=40, lengths=(9, 5, 12, 7, 9, 3, 10))
OPTS = WriteOptions(format="synthetic", shard_size=20_000)


def _raw(reader, split, key):
    eps = [reader.read(e) for e in reader.episode_ids()]
    return np.concatenate([e.arrays[key] for e in eps if e.split == split]).astype(np.float64)


def _check_against_numpy(s, x):
    x = x.reshape(len(x), *s["mean"].shape)
    assert s["count"] == len(x)
    np.testing.assert_allclose(s["mean"], x.mean(0), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(s["std"], x.std(0), rtol=1e-12, atol=1e-15)
    assert np.array_equal(s["min"], x.min(0)) and np.array_equal(s["max"], x.max(0))
    for name, q in QUANTILES.items():
        want = np.quantile(x, q, axis=0, method="lower")
        assert (np.abs(s[name] - want) <= REL_ERROR * np.abs(want)).all(), name


def _index_bytes(d):
    return (d / "index.json").read_bytes()


class _NanReader(SyntheticReader):
    """ep0003's state holds a NaN: its key gets no statistics, the write goes on."""

    def read(self, episode_id):
        ep = super().read(episode_id)
        if episode_id == "ep0003":
            ep.arrays["state"] = ep.arrays["state"].copy()
            ep.arrays["state"][1, 2] = np.nan
        return ep


def test_write_stores_per_split_statistics_equal_to_numpy_on_the_raw_arrays(tmp_path):
    write_shards(SYN, tmp_path / "s", OPTS, workers=2)
    index = EpisodeIndex.open(tmp_path / "s")
    for split in ("train", "val"):
        for key in ("action", "state", "keypoints"):
            _check_against_numpy(index.stats(key, split=split), _raw(SYN, split, key))
    assert index.stats("keypoints")["mean"].shape == (1, 2)  # per element of the step shape
    with pytest.raises(KeyError, match=r"no statistics for 'gripper' in split 'train'; it has \[.*'train/action'"):
        index.stats("gripper")


@pytest.mark.parametrize("num_jobs", [2, 3])
def test_merged_jobs_carry_the_single_job_statistics_byte_for_byte(tmp_path, num_jobs):
    write_shards(SYN, tmp_path / "one", OPTS)
    for i in range(num_jobs):
        write_shards(SYN, tmp_path / "multi", OPTS, num_jobs=num_jobs, job_index=i)
    merge_jobs(tmp_path / "multi", repack=True)
    one = json.loads(_index_bytes(tmp_path / "one"))
    assert "stats" not in one and one["stats_file"]["bytes"] == len((tmp_path / "one" / STATS_NAME).read_bytes())
    assert {s for s, _ in EpisodeIndex.open(tmp_path / "one").stats_keys()} == {"train", "val"}
    assert _index_bytes(tmp_path / "multi") == _index_bytes(tmp_path / "one")
    assert (tmp_path / "multi" / STATS_NAME).read_bytes() == (tmp_path / "one" / STATS_NAME).read_bytes()


def test_a_key_with_nan_is_listed_with_its_episode_and_merges_to_the_same_bytes(tmp_path):
    nan = _NanReader(**{k: getattr(SYN, k) for k in ("num_episodes", "length", "height", "width", "lengths")})
    write_shards(nan, tmp_path / "one", OPTS, workers=2)
    for i in range(3):  # ep0003 is in job 1: job 0's state statistics merge, then job 1's failure wins
        write_shards(nan, tmp_path / "multi", OPTS, num_jobs=3, job_index=i)
    merge_jobs(tmp_path / "multi", repack=True)
    assert _index_bytes(tmp_path / "multi") == _index_bytes(tmp_path / "one")
    index = EpisodeIndex.open(tmp_path / "one")
    with pytest.raises(KeyError, match="for 'state' in split 'train': episode 'ep0003' array 'state'.*NaN"):
        index.stats("state")
    _check_against_numpy(index.stats("action"), _raw(SYN, "train", "action"))
    _check_against_numpy(index.stats("state", split="val"), _raw(SYN, "val", "state"))  # ep0003 is train


def test_a_resumed_write_keeps_the_statistics_of_the_finished_episodes(tmp_path):
    write_shards(SYN, tmp_path / "ref", OPTS)

    class Crash(RuntimeError):
        pass

    class Crashing(SyntheticReader):
        def read(self, episode_id):
            if episode_id == "ep0005":
                raise Crash(episode_id)
            return super().read(episode_id)

    crashing = Crashing(**{k: getattr(SYN, k) for k in ("num_episodes", "length", "height", "width", "lengths")})
    for saved in ("log", "json", "none"):  # json, none: progress from an older episodepipes
        with pytest.raises(Crash):
            write_shards(crashing, tmp_path / "out", OPTS, overwrite=True)
        prog = progress.read(tmp_path / "out")  # the logged shards and episodes inline, as older files held them
        del prog["log"]
        assert prog["episodes"] and prog["stats"] is None
        assert len(prog["stats_log"]) <= len(prog["shards"])  # one record per save, for the episodes since the last
        log = tmp_path / "out" / STATS_LOG
        assert len(log.read_bytes()) == sum(r["bytes"] for r in prog["stats_log"])
        if saved != "log":
            fields = read_log(tmp_path / "out", prog["stats_log"], where="test")
            prog.update(stats_log=[], stats=fields.to_json() if saved == "json" else None)
            (tmp_path / "out" / PROGRESS_NAME).write_text(json.dumps(prog))
            log.unlink()
        assert write_shards(SYN, tmp_path / "out", OPTS).resumed
        assert _index_bytes(tmp_path / "out") == _index_bytes(tmp_path / "ref")
        assert (tmp_path / "out" / STATS_NAME).read_bytes() == (tmp_path / "ref" / STATS_NAME).read_bytes()
        assert not [p.name for p in (tmp_path / "out").glob("_progress*")]  # a finished write leaves no progress
    with pytest.raises(Crash):
        write_shards(crashing, tmp_path / "out", OPTS, overwrite=True)
    prog = progress.read(tmp_path / "out")
    del prog["log"]
    prog["stats"], prog["stats_log"] = {"stats": {"train": {"state": {}}}}, []
    (tmp_path / "out" / PROGRESS_NAME).write_text(json.dumps(prog))
    with pytest.raises(ValueError, match=r"_progress.json: stats\['train'\]\['state'\].*damaged.*--overwrite"):
        write_shards(SYN, tmp_path / "out", OPTS)
    with pytest.raises(Crash):
        write_shards(crashing, tmp_path / "out", OPTS, overwrite=True)
    log = tmp_path / "out" / STATS_LOG
    blob = bytearray(log.read_bytes())
    blob[-5] ^= 1
    log.write_bytes(bytes(blob))
    with pytest.raises(ValueError, match=r"_progress.stats.log: record \d+ does not match its sha256 in .*_progress"
                                         r".json; .*damaged.*--overwrite"):
        write_shards(SYN, tmp_path / "out", OPTS)


def test_a_crash_between_the_statistics_and_the_progress_file_still_resumes(tmp_path):
    """A save appends to the statistics log, then replaces the progress file: a crash in between leaves a tail
    the saved progress does not list, which the resumed write cuts off."""
    write_shards(SYN, tmp_path / "ref", OPTS)

    class Crashing(SyntheticReader):
        def read(self, episode_id):
            if episode_id == "ep0005":
                raise RuntimeError(episode_id)
            return super().read(episode_id)

    with pytest.raises(RuntimeError, match="ep0005"):
        write_shards(Crashing(**{k: getattr(SYN, k) for k in ("num_episodes", "length", "height", "width",
                                                              "lengths")}), tmp_path / "out", OPTS)
    with open(tmp_path / "out" / STATS_LOG, "ab") as f:
        f.write(b"torn half of a record")  # the crash's half-written append
    assert write_shards(SYN, tmp_path / "out", OPTS).resumed
    assert _index_bytes(tmp_path / "out") == _index_bytes(tmp_path / "ref")


def test_one_log_record_per_save_folds_its_episodes_as_one_by_one(tmp_path):
    """A save logs the episodes finished since the last one as one record (their fold, with the NaN key's
    first failure): a resume replays it to the uninterrupted run's statistics, byte for byte."""
    opts = WriteOptions(format="synthetic", shard_size=60_000)  # a few episodes a shard
    nan = _NanReader(**{k: getattr(SYN, k) for k in ("num_episodes", "length", "height", "width", "lengths")})
    write_shards(nan, tmp_path / "ref", opts)

    class Crashing(_NanReader):
        def read(self, episode_id):
            if episode_id == "ep0006":
                raise RuntimeError(episode_id)
            return super().read(episode_id)

    with pytest.raises(RuntimeError, match="ep0006"):
        write_shards(Crashing(**{k: getattr(SYN, k) for k in ("num_episodes", "length", "height", "width",
                                                              "lengths")}), tmp_path / "out", opts)
    prog = progress.read(tmp_path / "out")
    assert 0 < len(prog["stats_log"]) < len(prog["episodes"])
    fields = read_log(tmp_path / "out", prog["stats_log"], where="test")
    assert ("train", "state") in fields.missing  # ep0003's NaN, inside a record of several episodes
    assert write_shards(nan, tmp_path / "out", opts).resumed
    assert _index_bytes(tmp_path / "out") == _index_bytes(tmp_path / "ref")
    assert (tmp_path / "out" / STATS_NAME).read_bytes() == (tmp_path / "ref" / STATS_NAME).read_bytes()


def _rewrite(d, edit):
    data = json.loads(_index_bytes(d))
    edit(data)
    (d / "index.json").write_text(json.dumps(data))


def _inline(d):
    """Rewrite ``d``'s index as episodepipes wrote it before the side file: statistics in the JSON."""
    fields = StatsFields()
    fields.add_loaded(*statsfile.decode((d / STATS_NAME).read_bytes(), where="test"))
    _rewrite(d, lambda data: (data.pop("stats_file"), data.update(fields.to_json())))
    (d / STATS_NAME).unlink()
    return d


def test_an_older_index_with_inline_statistics_serves_them_and_upgrade_moves_them_out(tmp_path):
    from helpers import as_v1

    from episodepipes.sharding.upgrade import upgrade

    write_shards(SYN, tmp_path / "s", OPTS)
    fresh, side = _index_bytes(tmp_path / "s"), (tmp_path / "s" / STATS_NAME).read_bytes()
    want = EpisodeIndex.open(tmp_path / "s").stats("action")
    _inline(as_v1(tmp_path / "s"))
    assert "stats" in json.loads(_index_bytes(tmp_path / "s"))
    got = EpisodeIndex.open(tmp_path / "s").stats("action")
    assert all(np.array_equal(got[k], want[k]) for k in want)
    upgrade(tmp_path / "s")
    assert _index_bytes(tmp_path / "s") == fresh and (tmp_path / "s" / STATS_NAME).read_bytes() == side
    _inline(tmp_path / "s")  # a v2 index with inline statistics: upgrade only moves them out
    assert EpisodeIndex.open(tmp_path / "s").version == 2
    upgrade(tmp_path / "s")
    assert _index_bytes(tmp_path / "s") == fresh and (tmp_path / "s" / STATS_NAME).read_bytes() == side


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d.update(stats=[]), "stats should be an object of splits"),
    (lambda d: d["stats"]["train"].update(action=7), r"stats\['train'\]\['action'\]: should be an object"),
    (lambda d: d["stats"]["train"]["action"]["sum"].__setitem__(0, "1e9"),
     r"stats\['train'\]\['action'\]: sum should be a list of 7 hex strings"),
    (lambda d: d["stats"]["train"]["action"]["sketch"][0][1].__setitem__(0, 10**6),
     r"stats\['train'\]\['action'\]: sketch\[0\] should be"),
    (lambda d: d["stats"]["val"]["state"].update(min=[float(v) + 1 for v in d["stats"]["val"]["state"]["max"]]),
     r"stats\['val'\]\['state'\]: element 0 has inconsistent"),
    (lambda d: d["stats"]["train"].update(action=d["stats"]["val"]["action"]),
     r"stats\['train'\]\['action'\] count=\d+, but the index's train episodes with 'action' have \d+ steps"),
    (lambda d: d.update(stats_missing={"train": {"state": 3}}), "stats_missing should be an object of splits"),
])
def test_hostile_inline_statistics_are_refused_on_first_use_naming_the_field(tmp_path, edit, message):
    write_shards(SYN, tmp_path / "s", OPTS)
    _rewrite(_inline(tmp_path / "s"), edit)
    index = EpisodeIndex.open(tmp_path / "s")  # an open reads no statistics
    with pytest.raises(IndexFormatError, match=message + ".*stats .*--recompute"):
        index.stats("state", split="val")


def test_the_stats_command_prints_refuses_and_recomputes_an_older_index(tmp_path, capsys):
    write_shards(SYN, tmp_path / "s", OPTS)
    fresh = _index_bytes(tmp_path / "s")
    assert cli.main(["stats", str(tmp_path / "s")]) == 0
    out = capsys.readouterr().out.splitlines()
    n = sum(SYN.lengths[i] for i in range(7) if i % 3 != 2)
    assert f"train/action  count={n}  shape=(7,)" in out and "val/keypoints  count=15  shape=(1, 2)" in out
    assert len([line for line in out if line.startswith("  q50 ")]) == 6

    _rewrite(tmp_path / "s", lambda d: d.pop("stats_file"))  # an index written before statistics
    older = EpisodeIndex.open(tmp_path / "s")
    with pytest.raises(KeyError, match="has no statistics.*episodepipes-shard stats .* --recompute"):
        older.stats("action")
    assert cli.main(["stats", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no statistics" in err and "--recompute" in err
    assert cli.main(["stats", str(tmp_path / "s"), "--recompute"]) == 0
    assert _index_bytes(tmp_path / "s") == fresh  # the same fields a write with statistics stores


def test_recompute_refuses_a_shard_whose_bytes_changed(tmp_path, capsys):
    write_shards(SYN, tmp_path / "s", OPTS)
    _rewrite(tmp_path / "s", lambda d: d.pop("stats_file"))
    before = _index_bytes(tmp_path / "s")
    shard = tmp_path / "s" / "shard-000000.tar"
    blob = bytearray(shard.read_bytes())
    blob[3000] ^= 0xFF
    shard.write_bytes(bytes(blob))
    assert cli.main(["stats", str(tmp_path / "s"), "--recompute"]) == 2
    assert "crc32" in capsys.readouterr().err
    assert _index_bytes(tmp_path / "s") == before  # nothing written


def test_normalize_from_index_stats_end_to_end_in_a_train_pipe(tmp_path):
    write_shards(SYN, tmp_path / "s", OPTS, workers=2)
    index = EpisodeIndex.open(tmp_path / "s")
    stats = {k: index.stats(k, split="train") for k in ("action", "state")}
    for k in stats:
        _check_against_numpy(stats[k], _raw(SYN, "train", k))
    norm = Normalize.from_stats(stats)
    q = Normalize.from_stats(stats, mode="quantile")
    kw = dict(batch_size=4, seed=1, rank=0, world_size=1, num_workers=2)
    raw, done, qd = (list(train_pipe(index, transform=t, **kw)) for t in (None, norm, q))
    assert len(raw) == len(done) == len(qd) > 0
    seen = 0
    for r, d, y in zip(raw, done, qd):
        for k, s in stats.items():
            x = r[k].double().numpy()
            np.testing.assert_allclose(d[k].numpy(), (x - s["mean"]) / s["std"], rtol=1e-5, atol=1e-5)
            half = (s["q99"] - s["q01"]) / 2
            np.testing.assert_allclose(y[k].numpy(), (x - (s["q01"] + s["q99"]) / 2) / half, rtol=1e-4, atol=1e-4)
            assert torch.allclose(norm.inverse(d)[k].double(), r[k].double(), rtol=1e-5, atol=1e-6)
        seen += len(r["action"])
    assert seen == index.stats("action")["count"]  # one epoch of train: every step the statistics counted


def test_recompute_on_a_v1_index_and_upgrade_keeps_the_statistics(tmp_path):
    from helpers import as_v1

    from episodepipes.sharding.upgrade import upgrade

    write_shards(SYN, tmp_path / "s", OPTS)
    want = EpisodeIndex.open(tmp_path / "s").stats("state", split="val")
    with_stats = _index_bytes(as_v1(tmp_path / "s"))
    _rewrite(tmp_path / "s", lambda d: d.pop("stats_file"))  # a v1 index as an older episodepipes wrote it
    with pytest.raises(KeyError, match="--recompute"):
        EpisodeIndex.open(tmp_path / "s").stats("state", split="val")
    assert cli.main(["stats", str(tmp_path / "s"), "--recompute"]) == 0
    assert _index_bytes(tmp_path / "s") == with_stats and EpisodeIndex.open(tmp_path / "s").version == 1
    got = upgrade(tmp_path / "s").stats("state", split="val")  # v2's JSON part carries them over
    assert all(np.array_equal(got[k], want[k]) for k in want)


class _WideReader(SyntheticReader):
    """Adds a 40x30 "depth" array per step: more elements than statistics are kept for."""

    def read(self, episode_id):
        ep = super().read(episode_id)
        ep.arrays["depth"] = np.ones((len(ep.arrays["state"]), 40, 30), np.float32)
        return ep


def test_an_array_with_too_many_elements_per_step_is_listed_not_summed(tmp_path):
    wide = _WideReader(num_episodes=3, length=4, height=16, width=16)
    write_shards(wide, tmp_path / "s", WriteOptions(format="synthetic"))
    index = EpisodeIndex.open(tmp_path / "s")
    with pytest.raises(KeyError, match="'depth' has 1200 elements per step, more than the 1024"):
        index.stats("depth")
    assert index.stats("state")["count"] == 8  # ep0002 is val


@pytest.mark.parametrize("method", ["thread", "process"])
def test_normalize_in_a_metric_pipe_and_its_inverse_against_numpy_on_the_raw_arrays(tmp_path, method):
    from episodepipes.pipes import metric_pipe

    write_shards(SYN, tmp_path / "s", OPTS, workers=1)
    index = EpisodeIndex.open(tmp_path / "s")
    stats = {k: index.stats(k, split="val") for k in ("action", "state")}  # the val split's own statistics
    for k, s in stats.items():
        _check_against_numpy(s, _raw(SYN, "val", k))
    norm = Normalize.from_stats(stats)
    pipe = metric_pipe(index, frames_per_episode=4, batch_size=3, rank=0, world_size=2, method=method,
                       transform=norm)
    seen = 0
    for b in pipe:
        for k, s in stats.items():
            raw = np.stack([SYN.read(e).arrays[k][t] for e, t in zip(b["episode"], b["frame"].tolist())])
            assert b[k].dtype == torch.float32  # float32 stays float32
            np.testing.assert_allclose(b[k].numpy(), (raw.astype(np.float64) - s["mean"]) / s["std"],
                                       rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(norm.inverse(b)[k].numpy(), raw, rtol=1e-5, atol=1e-5)
        seen += int(b["valid"].sum())
    assert seen > 0
