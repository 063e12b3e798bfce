"""Typed samples: a training reader hands windows over as `StepWindow` fields, not as magic member keys."""

import pytest

from episodepipes.pipes import EpisodeIndex
from episodepipes.pipes.order.window import plan_windows
from episodepipes.pipes.sample import RawSample, StepWindow
from episodepipes.pipes.train import TrainReader


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    import dataclasses

    from episodepipes.sharding.formats.synthetic import SyntheticReader
    from episodepipes.sharding.write.encode import EncodeOptions, encode_episode
    from episodepipes.sharding.write.writer import ShardWriter

    out = tmp_path_factory.mktemp("sample") / "s"
    reader = SyntheticReader(num_episodes=2, length=5, height=16, width=24)
    with ShardWriter(out, shard_size=1 << 20, options={"jpeg_quality": 90}) as w:
        for eid in reader.episode_ids():
            w.add(encode_episode(dataclasses.replace(reader.read(eid), split="train"), EncodeOptions()))
    return EpisodeIndex.open(out)


def test_train_reader_samples_carry_windows_as_fields(index):
    eps = index.split("train")
    windows = plan_windows({"front": 3, "state": 2}, {"action": 3}, cameras=set(eps[0].cameras),
                           arrays=set(eps[0].arrays))
    reader = TrainReader(index, eps, windows=windows, seed=0, rank=0, world_size=1, batch_size=2, epochs=1)
    reader.reset()
    seen = 0
    for raw in reader:
        assert isinstance(raw, RawSample) and raw.damaged is None
        t, length = raw.item.frame, index.episode(raw.item.episode).length
        # the current step's plain members only: the windowed keys' fields live in raw.windows
        assert set(raw.members) == {"wrist.jpg", "json"} | {f"{k}.npy" for k in eps[0].arrays if k not in windows}
        assert set(raw.windows) == {"action", "front", "state"}
        for key, w in raw.windows.items():
            assert isinstance(w, StepWindow)
            want = [min(max(t + d, 0), length - 1) for d in range(windows[key].first, windows[key].last + 1)]
            assert list(w.steps) == want
            assert list(w.pad) == [not 0 <= t + d < length for d in range(windows[key].first, windows[key].last + 1)]
            assert set(w.data) == set(want)  # one member per distinct step: a padded repeat is decoded once
        seen += 1
    assert seen == reader.per_epoch
