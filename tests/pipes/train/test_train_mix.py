"""train_pipe over a weighted mixture of sources: exact shares, stop rules, key mapping, refusals by name."""

import itertools
from fractions import Fraction

import numpy as np
import pytest
from helpers import make_shards

from episodepipes.pipes import EpisodeIndex, Source
from episodepipes.pipes.normalize import PerSource
from episodepipes.pipes.order.mixture import Mixture
from episodepipes.pipes.train import train_pipe
from episodepipes.sharding.formats.synthetic import SyntheticReader
from episodepipes.sharding.write import WriteOptions, write_shards

A = dict(num_episodes=3, length=10, height=16, width=24, seed=1)  # train: ep0000, ep0001: 20 frames
B = dict(num_episodes=6, length=6, height=16, width=24, seed=2)  # train: ep0000 ep0001 ep0003 ep0004: 24 frames


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    d = tmp_path_factory.mktemp("mix")
    return {"a": make_shards(d / "a", **A), "b": make_shards(d / "b", **B),
            "top": make_shards(d / "top", **{**B, "cameras": ("top",)}),
            "big": make_shards(d / "big", **{**B, "height": 32, "width": 48}),
            **{f"stats_{s}": _written(d / f"stats_{s}", kw) for s, kw in (("a", A), ("b", B))}}


def _written(out, kw):
    """Shards by write_shards, which stores the index statistics."""
    write_shards(SyntheticReader(**kw), out, WriteOptions(format="synthetic", shard_size=20_000), workers=1)
    return out


def _mix(roots, wa=0.6, wb=0.4, **kw):
    return {"a": Source(roots["a"], wa), "b": Source(roots["b"], wb, **kw)}


def _items(pipe):
    return [list(zip(b["source"], b["episode"], b["frame"].tolist())) for b in pipe]


def test_each_batch_holds_the_exact_shares_and_each_sample_is_its_sources_frame(roots):
    pipe = train_pipe(_mix(roots), batch_size=5, seed=3, num_workers=1, rank=0, world_size=1)
    batches = list(pipe)
    mix = Mixture.of({"a": 0.6, "b": 0.4}, {"a": 20, "b": 24})
    assert len(batches) == len(pipe) == len(mix) // 5
    data = {s: SyntheticReader(**{k: v for k, v in kw.items()}) for s, kw in (("a", A), ("b", B))}
    for step, b in enumerate(batches):
        assert b["source"].count("a") == mix.counts(5 * step + 5)[0] - mix.counts(5 * step)[0] == 3  # 3/5 of 5
        for i, (s, e, f) in enumerate(zip(b["source"], b["episode"], b["frame"].tolist())):
            np.testing.assert_array_equal(b["state"][i].numpy(), data[s].read(e).arrays["state"][f])
    seen = {s: {(e, f) for b in _items(pipe) for s2, e, f in b if s2 == s} for s in "ab"}
    # the default stop rule cycles: the epoch lasts until every source gave each of its frames (a is cycled);
    # drop-last leaves fewer than a batch of the last source's frames out, as in a pipe of one source
    assert len(seen["a"]) == 20 and 24 - 4 <= len(seen["b"]) < 24
    assert {e for b in batches for e in b["episode"]} >= {"ep0000", "ep0001"}  # plain ids, shared by both sources


def test_first_exhausted_ends_the_epoch_before_any_source_repeats(roots):
    pipe = train_pipe(_mix(roots), batch_size=4, seed=3, num_workers=1, rank=0, world_size=1, stop="first_exhausted")
    items = [x for b in _items(pipe) for x in b]
    mix = Mixture.of({"a": 0.6, "b": 0.4}, {"a": 20, "b": 24}, stop="first_exhausted")
    assert len(items) == len(pipe) * 4 == len(mix) // 4 * 4 and len(set(items)) == len(items)
    cycled = [x for b in _items(train_pipe(_mix(roots), batch_size=4, seed=3, num_workers=1, rank=0, world_size=1))
              for x in b]
    assert len(cycled) > len(items) and len(set(cycled)) < len(cycled)  # a's frames come round again
    with pytest.raises(ValueError, match=r"stop='never' should be one of \('cycle', 'first_exhausted'\)"):
        train_pipe(_mix(roots), batch_size=4, seed=3, stop="never")


@pytest.mark.parametrize("world", [2, 3])
def test_every_rank_gets_the_same_batches_count_and_the_ranks_share_each_step(roots, world):
    one = _items(train_pipe(_mix(roots), batch_size=6, seed=1, num_workers=1, rank=0, world_size=1))
    per = [_items(train_pipe(_mix(roots), batch_size=6 // world, seed=1, num_workers=1, rank=r, world_size=world))
           for r in range(world)]
    assert len({len(p) for p in per}) == 1 and len(per[0]) == len(one)
    for step, want in enumerate(one):
        assert sorted(x for p in per for x in p[step]) == sorted(want)
    # the deal is keyed: no rank is given one source only, though the interleave alternates
    assert all(len({s for b in p for s, _, _ in b}) == 2 for p in per)


def test_keys_rename_and_select_so_sources_of_other_cameras_stack(roots):
    mix = {"a": Source(roots["a"], 1, keys={"front": "image", "state": "state"}),
           "t": Source(roots["top"], 1, keys={"top": "image", "state": "state"})}
    pipe = train_pipe(mix, batch_size=4, seed=0, num_workers=1, rank=0, world_size=1, history={"image": 2})
    b = next(iter(pipe))
    assert set(b) == {"image", "image_pad", "state", "source", "episode", "frame", "timestamp", "valid", "prompt"}
    assert tuple(b["image"].shape) == (4, 2, 3, 16, 24)
    assert sum(len(x["source"]) for x in pipe) == len(pipe) * 4


def test_a_mismatch_that_remains_is_refused_by_source_episode_and_key(roots):
    with pytest.raises(ValueError, match=r"source 'a' episode 'ep0000' and source 't' episode 'ep0000' cannot share "
                                         r"a batch: camera 'front' is in episode 'ep0000' but not in 'ep0000'.*"
                                         r"Source\(keys=\.\.\.\)"):
        train_pipe({"a": Source(roots["a"], 1), "t": Source(roots["top"], 1)}, batch_size=2, seed=0)
    with pytest.raises(ValueError, match=r"source 'a' episode 'ep0000' and source 'big' episode 'ep0000' cannot "
                                         r"share a batch: camera sizes.*resize=\(H, W\)"):
        train_pipe({"a": Source(roots["a"], 1), "big": Source(roots["big"], 1)}, batch_size=2, seed=0)
    b = next(iter(train_pipe({"a": Source(roots["a"], 1), "big": Source(roots["big"], 1)}, batch_size=4, seed=0,
                              num_workers=1, resize=(16, 24))))
    assert tuple(b["front"].shape) == (4, 3, 16, 24)
    with pytest.raises(ValueError, match=r"source 'a' episode 'ep0000' and source 'b' episode 'ep0000' cannot share "
                                         r"a batch: array 'state' is <f4 \[7\] in episode 'ep0000' but <f4 \[1, 2\]"):
        train_pipe({"a": Source(roots["a"], 1, keys={"front": "image", "state": "state"}),
                    "b": Source(roots["b"], 1, keys={"front": "image", "keypoints": "state"})}, batch_size=2, seed=0)
    with pytest.raises(ValueError, match=r"Source 'a' keys= names \['rear'\], not cameras or arrays of its episode "
                                         r"'ep0000'; known: \['action', 'front'"):
        train_pipe({"a": Source(roots["a"], 1, keys={"rear": "image"})}, batch_size=2, seed=0)
    with pytest.raises(ValueError, match=r"batch keys \['source'\] of the mixture clash"):
        train_pipe({"a": Source(roots["a"], 1, keys={"state": "source"})}, batch_size=2, seed=0)


def test_other_forms_of_a_mixture_are_refused_by_name(roots):
    with pytest.raises(TypeError, match=r"mixture source 'b' is a tuple; write 'b': Source\(root, weight"):
        train_pipe({"a": Source(roots["a"], 1), "b": (roots["b"], 0.4)}, batch_size=2, seed=0)
    with pytest.raises(TypeError, match=r"train_pipe got a list of sources; a mixture is a dict"):
        train_pipe([Source(roots["a"], 1)], batch_size=2, seed=0)
    with pytest.raises(ValueError, match=r"for a mixture pass them per source: Source\(root, weight, episodes="):
        train_pipe(_mix(roots), batch_size=2, seed=0, where=lambda a: True)
    with pytest.raises(ValueError, match=r"stop='cycle' is a mixture's stop rule"):
        train_pipe(roots["a"], batch_size=2, seed=0, stop="cycle")
    with pytest.raises(ValueError, match=r"weight of 'b'=0 should be positive"):
        train_pipe(_mix(roots, wb=0), batch_size=2, seed=0)
    with pytest.raises(ValueError, match=r"^weight of 'b'=nan should be a finite positive number$"):
        train_pipe(_mix(roots, wb=float("nan")), batch_size=2, seed=0)
    with pytest.raises(ValueError, match=r"^weight of 'a'=1e\+308 is more than 1000000000 times that of 'b'=1;"):
        train_pipe(_mix(roots, wa=1e308, wb=1), batch_size=2, seed=0)


def test_episodes_and_where_choose_per_source(roots):
    mix = {"a": Source(roots["a"], 1, episodes=["ep0001"]),
           "b": Source(roots["b"], 1, where=lambda at: at["id"] in ("ep0003", "ep0004"))}
    items = {(s, e) for b in _items(train_pipe(mix, batch_size=4, seed=0, num_workers=1)) for s, e, _ in b}
    assert items == {("a", "ep0001"), ("b", "ep0003"), ("b", "ep0004")}
    val = {"a": Source(roots["a"], 1, split="val"), "b": Source(roots["b"], 1)}  # b: the pipe's split
    items = {(s, e) for b in _items(train_pipe(val, batch_size=4, seed=0, num_workers=1)) for s, e, _ in b}
    assert items == {("a", "ep0002"), ("b", "ep0000"), ("b", "ep0001"), ("b", "ep0003"), ("b", "ep0004")}


def test_the_transform_sees_plain_ids_and_the_source_and_normalizes_each_source_by_its_statistics(roots):
    idx = {s: EpisodeIndex.open(roots[f"stats_{s}"]) for s in "ab"}
    roots = {"a": roots["stats_a"], "b": roots["stats_b"]}
    norm = PerSource.from_stats({s: {"state": idx[s].stats("state", split="train")} for s in "ab"})
    kw = dict(batch_size=4, seed=5, num_workers=1, rank=0, world_size=1, history={"state": 2})
    raw = list(train_pipe(_mix(roots), **kw))
    done = list(train_pipe(_mix(roots), transform=norm, **kw))
    assert len(raw) == len(done)
    for r, d in zip(raw, done):
        assert r["source"] == d["source"] and r["episode"] == d["episode"]
        for i, s in enumerate(r["source"]):
            st = idx[s].stats("state", split="train")
            want = (r["state"][i].numpy().astype(np.float64) - st["mean"]) / st["std"]
            np.testing.assert_allclose(d["state"][i].numpy(), want, rtol=1e-5, atol=1e-5)
    means = {s: np.concatenate([d["state"][i, -1:].numpy() for d in done for i, x in enumerate(d["source"])
                                if x == s]) for s in "ab"}
    assert all(abs(m.mean()) < 0.6 for m in means.values())  # centred per source, not on the pooled mean


def test_process_workers_give_the_thread_batches(roots):
    kw = dict(batch_size=4, seed=2, num_workers=2, rank=0, world_size=1, horizon={"action": 3})
    t = list(itertools.islice(iter(train_pipe(_mix(roots), **kw)), 4))
    p = list(itertools.islice(iter(train_pipe(_mix(roots), method="process", **kw)), 4))
    for x, y in zip(t, p):
        assert x["source"] == y["source"] and x["episode"] == y["episode"]
        assert all((x[k] == y[k]).all() for k in ("front", "action", "frame"))


def test_weights_are_exact_fractions_in_the_state(roots):
    pipe = train_pipe(_mix(roots, wa=3, wb=2), batch_size=4, seed=0, num_workers=1)
    st = pipe.state_dict()["root"]["source"]["source"]["source"]
    assert st["weights"] == {"a": str(Fraction(3, 5)), "b": str(Fraction(2, 5))} and st["stop_rule"] == "cycle"


def test_the_transform_gets_the_plain_episode_id_and_the_source_name(roots):
    seen = []

    def look(sample):
        seen.append((sample["source"], sample["episode"]))
        return {**sample, "state": sample["state"] * 2}

    b = next(iter(train_pipe(_mix(roots), batch_size=5, seed=3, num_workers=1, transform=look)))
    want = {(s, e) for s, e in zip(b["source"], b["episode"])}
    assert want <= set(seen) and all(s in ("a", "b") and e.startswith("ep") for s, e in seen)
    assert "source" in b and isinstance(b["source"], list)


def test_a_corrupt_frame_of_one_source_is_skipped_or_raised_naming_that_source(tmp_path):
    a = make_shards(tmp_path / "a", **A)
    b = EpisodeIndex.open(make_shards(tmp_path / "b", **B))
    shard, start, end = b.episode("ep0001").frame_range(2)
    path = b.shard_path(shard)
    data = bytearray(path.read_bytes())
    data[(start + end) // 2] ^= 0x5A  # the frame no longer matches its crc32 in the index
    path.write_bytes(bytes(data))
    mix = {"a": Source(a, 1), "b": Source(b, 1)}
    pipe = train_pipe(mix, batch_size=4, seed=0, num_workers=1, rank=0, world_size=1)
    bad = {(s, e, f) for x in pipe for s, e, f, v in zip(x["source"], x["episode"], x["frame"].tolist(),
                                                         x["valid"].tolist()) if not v}
    assert bad == {("b", "ep0001", 2)} and pipe.stats["frames_corrupt"] >= 1  # a's ep0001 frame 2 is fine
    with pytest.raises(ValueError, match=r"shard b:shard-000000\.tar episode 'b:ep0001' frame 2"):
        list(train_pipe(mix, batch_size=4, seed=0, num_workers=1, on_corrupt="raise"))


def test_an_endless_mixture_has_no_len_and_runs_into_the_next_epoch(roots):
    epoch = len(train_pipe(_mix(roots), batch_size=4, seed=0, num_workers=1))
    pipe = train_pipe(_mix(roots), batch_size=4, seed=0, num_workers=1, epochs=None)
    with pytest.raises(TypeError, match="infinite and has no len"):
        len(pipe)
    got = _items(itertools.islice(iter(pipe), 2 * epoch + 1))
    assert len(got) == 2 * epoch + 1 and got[:epoch] != got[epoch:2 * epoch]
