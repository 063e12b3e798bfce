"""torchdata.nodes graphs over episodepipes shards: nodes, the lazy gate, and one builder per pipe kind."""

from episodepipes.index import ArraySpec, Camera, Episode, EpisodeIndex, Segment, Shard
from episodepipes.pipes.batch import BatchStacker, collate
from episodepipes.pipes.builders import metric_pipe, video_pipe
from episodepipes.pipes.decode import Decoder, decode_jpeg
from episodepipes.pipes.gate import Gate
from episodepipes.pipes.pipe import Pipe
from episodepipes.pipes.plan import Item
from episodepipes.pipes.read import RawSample, ShardReader
from episodepipes.pipes.stats import Stats
from episodepipes.pipes.train import train_pipe

__all__ = [
    "ArraySpec",
    "BatchStacker",
    "Camera",
    "Decoder",
    "Episode",
    "EpisodeIndex",
    "Gate",
    "Item",
    "Pipe",
    "RawSample",
    "Segment",
    "Shard",
    "ShardReader",
    "Stats",
    "collate",
    "decode_jpeg",
    "metric_pipe",
    "train_pipe",
    "video_pipe",
]
