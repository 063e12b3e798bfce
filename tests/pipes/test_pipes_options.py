"""DecodeOptions and ReadOptions: one definition and check of each option the builders share."""

import dataclasses

import pytest

from episodepipes.pipes import Decoder, EpisodeIndex, ShardReader, metric_pipe, train_pipe, video_pipe
from episodepipes.pipes.options import DecodeOptions, ReadOptions
from episodepipes.pipes.plan import Item


@pytest.fixture(scope="module")
def shards(shard_folder):
    return shard_folder("opt", num_episodes=2, length=6, height=16, width=24)


@pytest.mark.parametrize("kw, match", [
    ({"num_workers": 0}, "num_workers=0"), ({"num_workers": True}, "num_workers=True"),
    ({"method": "fork"}, "method='fork'"), ({"on_corrupt": "ignore"}, "on_corrupt='ignore'"),
    ({"resize": (0, 8)}, r"resize=\(0, 8\)"), ({"resize": (8,)}, r"resize=\(8,\)"),
    ({"resize": "8x8"}, "resize='8x8'"), ({"resize": (True, 8)}, r"resize=\(True, 8\)"),
])
def test_each_decode_option_is_refused_by_name_in_every_builder(shards, kw, match):
    with pytest.raises(ValueError, match=match):
        DecodeOptions(**kw)
    with pytest.raises(ValueError, match=match):
        metric_pipe(shards, split="train", frames_per_episode=2, batch_size=2, **kw)
    with pytest.raises(ValueError, match=match):
        video_pipe(shards, episodes=["ep0000"], batch_size=2, max_batches=1, **kw)
    with pytest.raises(ValueError, match=match):
        train_pipe(shards, batch_size=2, seed=0, rank=0, world_size=1, **kw)
    with pytest.raises(ValueError, match=match):
        Decoder(ShardReader(EpisodeIndex.open(shards), []), EpisodeIndex.open(shards), **kw)


def test_read_options_are_refused_by_name(shards):
    with pytest.raises(ValueError, match="verify='yes'"):
        ReadOptions(verify="yes")
    with pytest.raises(TypeError, match="url"):  # the old streaming argument is gone: a dataset root may be a URL
        video_pipe(shards, episodes=["ep0000"], batch_size=2, max_batches=1, url="http://x")


def test_options_are_frozen_keyword_only_and_normalised():
    o = DecodeOptions(resize=[8, 12])
    assert o.resize == (8, 12) and o.num_workers == 2 and o.method == "thread" and o.on_corrupt == "skip"
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.method = "process"  # type: ignore[misc]
    with pytest.raises(TypeError):
        DecodeOptions(2)  # type: ignore[misc]


def test_a_decoder_takes_the_options_object_or_its_fields_as_keywords(shards):
    idx = EpisodeIndex.open(shards)
    items = [Item("ep0001", f) for f in range(6)]
    flat = Decoder(ShardReader(idx, items), idx, num_workers=1, resize=(8, 12))
    whole = Decoder(ShardReader(idx, items), idx, DecodeOptions(num_workers=1, resize=(8, 12)))
    assert flat.options == whole.options == DecodeOptions(num_workers=1, resize=(8, 12))
    over = Decoder(ShardReader(idx, items), idx, DecodeOptions(num_workers=1), method="process")
    assert over.options == DecodeOptions(num_workers=1, method="process")
    got = [s["front"].shape for s in whole]
    assert got == [(3, 8, 12)] * 6
