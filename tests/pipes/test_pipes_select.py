"""``episodes=`` and ``where=`` on every builder: resolved from the index alone, refused by name when wrong."""

import pytest

from episodepipes.index import EpisodeIndex
from episodepipes.pipes.builders import metric_pipe, video_pipe
from episodepipes.pipes.train import train_pipe
from episodepipes.sharding.formats.synthetic import SyntheticReader
from episodepipes.sharding.write.encode import EncodeOptions, encode_episode
from episodepipes.sharding.write.writer import ShardWriter

LENGTHS = (9, 5, 12, 7, 9, 3, 10)  # ep0002 and ep0005 are val


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    """Seven episodes; odd ones carry robot_type="aloha", as a reader's extra metadata."""
    out = tmp_path_factory.mktemp("sel") / "s"
    reader = SyntheticReader(num_episodes=7, lengths=LENGTHS, height=16, width=24)
    with ShardWriter(out, shard_size=20_000, options={"jpeg_quality": 90}) as w:
        for n, eid in enumerate(reader.episode_ids()):
            enc = encode_episode(reader.read(eid), EncodeOptions())
            w.add_frames(dict(enc.meta, robot_type="aloha" if n % 2 else "franka"), enc.data(), enc.sizes)
    return EpisodeIndex.open(out)


def _train_episodes(index, **kw):
    pipe = train_pipe(index, batch_size=1, seed=0, rank=0, world_size=1, num_workers=1, **kw)
    return [e for b in pipe for e in b["episode"]]


def test_train_pipe_reads_only_the_chosen_episodes(index):
    got = _train_episodes(index, where=lambda a: a["robot_type"] == "aloha" and a["length"] >= 7)
    assert got == ["ep0003"] * 7
    got = _train_episodes(index, episodes=["ep0004", "ep0000"])
    assert sorted(set(got)) == ["ep0000", "ep0004"] and len(got) == 9 + 9
    assert len(train_pipe(index, batch_size=2, seed=0, rank=0, world_size=1, episodes=["ep0006"])) == 5


def test_metric_and_video_pipes_take_them_too(index):
    pipe = metric_pipe(index, frames_per_episode=2, batch_size=2, rank=0, world_size=1,
                       where=lambda a: a["id"] == "ep0005")
    assert [e for b in pipe for e in b["episode"]] == ["ep0005", "ep0005"]
    pipe = video_pipe(index, batch_size=4, max_batches=10, where=lambda a: a["robot_type"] == "aloha"
                      and a["split"] == "val")
    assert {e for b in pipe for e in b["episode"]} == {"ep0005"}
    pipe = video_pipe(index, episodes=["ep0003", "ep0001"], batch_size=4, max_batches=10,
                      where=lambda a: a["length"] > 5)  # the given order is kept
    assert list(dict.fromkeys(e for b in pipe for e in b["episode"])) == ["ep0003"]


def test_bad_selections_are_refused_by_name(index):
    with pytest.raises(ValueError, match=r"names \['ep0002'\], which are not in split='train'"):
        train_pipe(index, batch_size=1, seed=0, rank=0, world_size=1, episodes=["ep0000", "ep0002"])
    with pytest.raises(KeyError, match="'ep0009' is not in .*close matches"):
        train_pipe(index, batch_size=1, seed=0, rank=0, world_size=1, episodes=["ep0009"])
    with pytest.raises(ValueError, match=r"names \['ep0000'\] more than once"):
        train_pipe(index, batch_size=1, seed=0, rank=0, world_size=1, episodes=["ep0000", "ep0000"])
    with pytest.raises(ValueError, match="where= keeps none of the 5 episodes of split='train'.*robot_type"):
        train_pipe(index, batch_size=1, seed=0, rank=0, world_size=1, where=lambda a: a["length"] > 99)
    with pytest.raises(TypeError, match="where= returned 'yes' for episode 'ep0000'"):
        metric_pipe(index, split="train", frames_per_episode=1, batch_size=1, rank=0, world_size=1,
                    where=lambda a: "yes")
    with pytest.raises(ValueError, match="needs episodes= .* or where="):
        video_pipe(index, batch_size=1, max_batches=1)
