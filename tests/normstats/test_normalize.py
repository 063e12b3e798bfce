import pickle

import numpy as np
import pytest
import torch

from episodepipes.normstats import StatsTable
from episodepipes.pipes import EpisodeIndex
from episodepipes.pipes.normalize import Normalize, PerSource
from episodepipes.pipes.train import train_pipe
from episodepipes.sharding.formats.synthetic import SyntheticReader

RNG = np.random.default_rng(0)
DATA = (RNG.normal(0, 1, (4000, 3)) * [1.0, 20.0, 0.01] + [0.0, 5.0, -3.0]).astype(np.float32)


def _table(data=DATA, split="train", key="action"):
    t = StatsTable()
    t.add(split, key, data)
    return t


def test_mean_std_gives_zero_mean_unit_std_and_keeps_float32():
    norm = Normalize.from_stats({"action": _table().get("action", split="train")})
    y = norm({"action": DATA, "frame": 3})["action"]
    assert y.dtype == np.float32
    np.testing.assert_allclose(y.astype(np.float64).mean(0), 0, atol=1e-5)
    np.testing.assert_allclose(y.astype(np.float64).std(0), 1, atol=1e-5)


@pytest.mark.parametrize(("mode", "lo", "hi"), [("quantile", "q01", "q99"), ("min_max", "min", "max")])
def test_range_modes_send_their_bounds_to_minus_one_and_one(mode, lo, hi):
    s = _table().get("action", split="train").summary()
    norm = Normalize.from_stats({"action": s}, mode=mode)
    y = norm({"action": np.stack([s[lo], s[hi]])})["action"]
    np.testing.assert_allclose(y, [[-1] * 3, [1] * 3], atol=1e-12)
    if mode == "quantile":  # about 1% of each dimension lies outside [-1, 1]; not clipped
        out = (np.abs(norm({"action": DATA.astype(np.float64)})["action"]) > 1).mean(0)
        assert ((out > 0.01) & (out < 0.04)).all(), out


@pytest.mark.parametrize("mode", ["mean_std", "quantile", "min_max"])
def test_inverse_undoes_the_call_for_numpy_and_batched_torch_predictions(mode):
    norm = Normalize.from_stats({"action": _table().get("action", split="train")}, mode=mode)
    window = DATA[:40].reshape(10, 4, 3)  # a batch of horizon windows: any leading axes broadcast
    y = norm({"action": window})["action"]
    np.testing.assert_allclose(norm.inverse({"action": y})["action"], window, rtol=1e-5, atol=1e-5)
    t = torch.from_numpy(y)
    back = norm.inverse({"action": t, "episode": ["e"] * 10})
    assert isinstance(back["action"], torch.Tensor) and back["action"].dtype == torch.float32
    assert back["episode"] == ["e"] * 10
    np.testing.assert_allclose(back["action"].numpy(), window, rtol=1e-5, atol=1e-5)
    assert norm.inverse({"action": torch.zeros(2, 3, dtype=torch.int64)})["action"].dtype == torch.float32


def test_a_constant_dimension_is_centred_not_divided_by_zero():
    data = np.column_stack([np.full(50, 2.0), np.linspace(-1, 1, 50)])
    for mode in ("mean_std", "quantile", "min_max"):
        norm = Normalize.from_stats({"q": _table(data, key="q").get("q", split="train")}, mode=mode)
        assert norm.scale["q"][0] == 1.0
        y = norm({"q": data})["q"]
        assert np.isfinite(y).all() and (y[:, 0] == 0).all()
        assert np.array_equal(norm.inverse({"q": y})["q"][:, 0], data[:, 0])


def test_it_pickles_and_is_refused_by_name_when_misused():
    norm = Normalize.from_stats({"action": _table().get("action", split="train")}, keys=["action"])
    again = pickle.loads(pickle.dumps(norm))
    assert np.array_equal(again({"action": DATA})["action"], norm({"action": DATA})["action"])
    with pytest.raises(KeyError, match="statistics for 'action' but the sample has keys"):
        norm({"state": DATA})
    with pytest.raises(ValueError, match=r"'action' has shape \(4, 2\); its statistics are for steps of shape \(3,\)"):
        norm({"action": np.zeros((4, 2))})
    with pytest.raises(KeyError, match="none of the normalized keys"):
        norm.inverse({"state": DATA})
    with pytest.raises(ValueError, match="mode='zscore'"):
        Normalize.from_stats({"action": _table().get("action", split="train")}, mode="zscore")
    with pytest.raises(KeyError, match="keys names 'gripper'"):
        Normalize.from_stats({"action": _table().get("action", split="train")}, keys=["gripper"])


def test_per_source_statistics_pick_each_rows_own_source():
    a, b = DATA, DATA * 3 + 10
    per = PerSource.from_stats({"droid": {"action": _table(a).get("action", split="train")},
                                "aloha": {"action": _table(b).get("action", split="train")}})
    ya = per({"action": a[:4], "source": "droid"})["action"]
    yb = per({"action": b[:4], "source": "aloha"})["action"]
    np.testing.assert_allclose(ya, yb, atol=1e-4)  # the same data up to each source's own affine map
    batch = {"action": torch.from_numpy(np.concatenate([ya[:2], yb[2:]])), "source": ["droid"] * 2 + ["aloha"] * 2}
    back = per.inverse(batch)["action"].numpy()
    np.testing.assert_allclose(back, np.concatenate([a[:2], b[2:4]]), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(per.inverse({"action": yb}, source="aloha")["action"], b[:4], rtol=1e-5, atol=1e-4)
    with pytest.raises(KeyError, match="source 'rt1' has no statistics"):
        per({"action": a[:1], "source": "rt1"})
    with pytest.raises(KeyError, match="no 'source' field naming its source"):
        per({"action": a[:1]})


@pytest.fixture(scope="module")
def shards(shard_folder):
    kw = dict(num_episodes=4, lengths=(9, 6, 5, 8), height=16, width=24)
    out = shard_folder("norm", shard_size=20_000, **kw)
    reader, table = SyntheticReader(**kw), StatsTable()
    for eid in reader.episode_ids():
        ep = reader.read(eid)
        for k, v in ep.arrays.items():
            table.add(ep.split, k, v, where=f"episode {eid}")
    return EpisodeIndex.open(out), table


def test_a_train_pipe_normalizes_in_process_workers_and_the_inverse_restores_the_batch(shards):
    index, table = shards
    norm = Normalize.from_stats({k: table.get(k, split="train") for k in ("action", "state")})
    kw = dict(batch_size=4, seed=3, rank=0, world_size=1, method="process", horizon={"action": 3})
    raw = list(train_pipe(index, **kw))
    done = list(train_pipe(index, transform=norm, **kw))
    assert len(raw) == len(done) > 0
    s = table.get("action", split="train").summary()
    for r, d in zip(raw, done):
        assert r["episode"] == d["episode"] and torch.equal(r["frame"], d["frame"])
        want = (r["action"].double().numpy() - s["mean"]) / s["std"]
        np.testing.assert_allclose(d["action"].numpy(), want, rtol=1e-5, atol=1e-5)
        back = norm.inverse(d)
        for k in ("action", "state"):
            np.testing.assert_allclose(back[k].numpy(), r[k].numpy(), rtol=1e-5, atol=1e-5)
