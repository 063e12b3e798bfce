"""Names that become paths: video loader names (folders) and episode ids (file names)."""

import dataclasses

import lightning.pytorch as pl
import pytest
from ddp.app import EpisodeData, TinyModel
from helpers import make_shards

from episodepipes.lightning_glue import OverlayVideoWriter, ValLoaders
from episodepipes.lightning_glue.names import MAX_STEM, video_stem
from episodepipes.pipes import video_pipe
from episodepipes.sharding.formats.synthetic import SyntheticReader
from episodepipes.sharding.write.encode import EncodeOptions, encode_episode
from episodepipes.sharding.write.writer import ShardWriter

LONG = "robot-kitchen-" + "x" * 286  # 300 characters: a legal episode id, too long for a file name with a suffix


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return str(make_shards(tmp_path_factory.mktemp("names") / "s", num_episodes=3, length=6, height=32, width=48))


@pytest.mark.parametrize("bad", ["..", "../up", "a/b", ".hidden", "", "a\0b", "x" * 65, "with space", 3])
def test_unusable_video_loader_names_are_refused_when_built(root, bad):
    pipe = video_pipe(root, episodes=["ep0000"], batch_size=4, max_batches=2)
    with pytest.raises(ValueError, match=r"video loader name .* names its videos' folder"):
        ValLoaders(videos={bad: pipe})


def test_names_that_share_a_folder_on_a_case_insensitive_filesystem_are_refused(root):
    a = video_pipe(root, episodes=["ep0000"], batch_size=4, max_batches=2)
    b = video_pipe(root, episodes=["ep0001"], batch_size=4, max_batches=2)
    with pytest.raises(ValueError, match="'pinned' and 'Pinned' would share one folder"):
        ValLoaders(videos={"pinned": a, "Pinned": b})
    assert ValLoaders(videos={"pinned.v2": a, "front-cam_1": b}).names == ["pinned.v2", "front-cam_1"]


def test_a_long_episode_id_gets_a_short_stable_distinct_stem():
    other = LONG[:-1] + "y"
    s1, s2 = video_stem(LONG), video_stem(other)
    assert len(s1) == MAX_STEM and s1.startswith("robot-kitchen-xxx") and s1 == video_stem(LONG)
    assert s1 != s2 and s1[:-12] == s2[:-12]  # same prefix, different hash suffix
    assert video_stem("ep0001") == "ep0001"  # a short id stays as it is


def test_a_300_character_episode_id_renders(tmp_path):
    reader = SyntheticReader(num_episodes=3, length=5, height=32, width=48)
    with ShardWriter(tmp_path / "s", shard_size=1 << 20, options={"jpeg_quality": 90}) as w:
        w.add(encode_episode(dataclasses.replace(reader.read("ep0000"), id=LONG), EncodeOptions(jpeg_quality=90)))
        w.add(encode_episode(reader.read("ep0002"), EncodeOptions(jpeg_quality=90)))  # the metric loader's val
    writer = OverlayVideoWriter(tmp_path / "v", every_n_passes=1)
    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=[writer])
    trainer.validate(TinyModel(), datamodule=EpisodeData(str(tmp_path / "s"), pinned=[LONG]), verbose=False)
    (path,) = writer.written
    assert path.exists() and path.name == f"{video_stem(LONG)}_step00000000_validate.mp4"
    assert len(path.name) < 255
