"""torchdata.nodes graphs over episodepipes shards."""

from episodepipes.pipes.index import ArraySpec, Camera, Episode, EpisodeIndex, Segment, Shard

__all__ = ["ArraySpec", "Camera", "Episode", "EpisodeIndex", "Segment", "Shard"]
