"""The shard folder's index: `EpisodeIndex` and its records (the public path ``episodepipes.index``).

See README.md in this folder for which module holds what.
"""

from episodepipes.errors import IndexFormatError
from episodepipes.filebytes import mapped, sha256_file  # noqa: F401 (`mapped`: importable here since the split)
from episodepipes.index.episode_index import EpisodeIndex
from episodepipes.index.episodes import Episode
from episodepipes.index.records import ArraySpec, Camera, Segment, Shard
from episodepipes.index.tables import Tables

__all__ = ["ArraySpec", "Camera", "Episode", "EpisodeIndex", "IndexFormatError", "Segment", "Shard", "Tables",
           "sha256_file"]
