"""torchdata.nodes graphs over episodepipes shards: nodes, the lazy gate, and one builder per pipe kind."""

from episodepipes.index import ArraySpec, Camera, Episode, EpisodeIndex, Segment, Shard
from episodepipes.pipes.batch import BatchStacker, collate
from episodepipes.pipes.builders import metric_pipe, video_pipe
from episodepipes.pipes.decode import Decoder
from episodepipes.pipes.frames import decode_jpeg
from episodepipes.pipes.gate import Gate
from episodepipes.pipes.options import DecodeOptions, ReadOptions
from episodepipes.pipes.pipe import Pipe
from episodepipes.pipes.plan import Item
from episodepipes.pipes.read import ShardReader
from episodepipes.pipes.sample import RawSample
from episodepipes.pipes.stats import Stats
from episodepipes.pipes.train import train_pipe
from episodepipes.pipes.train.mix import Source

__all__ = [
    "ArraySpec",
    "BatchStacker",
    "Camera",
    "DecodeOptions",
    "Decoder",
    "Episode",
    "EpisodeIndex",
    "Gate",
    "Item",
    "Pipe",
    "RawSample",
    "ReadOptions",
    "Segment",
    "Shard",
    "ShardReader",
    "Source",
    "Stats",
    "collate",
    "decode_jpeg",
    "metric_pipe",
    "train_pipe",
    "video_pipe",
]
