"""Episodes in, WebDataset shards and an index out.

A *reader* (`EpisodeReader`: ``episode_ids()`` and ``read(id) -> EpisodeData``) turns one dataset
layout into episodes; the registry (`open_reader`, `register_format`) picks it by name or by
detection, and finds custom readers through ``module:factory`` names and the ``episodepipes.formats``
entry points (`episodepipes.sharding.formats.readers`). `write_shards` encodes episodes in worker processes
and appends them with one `ShardWriter`, resumably and byte-reproducibly; `merge_jobs` joins multi-job
outputs. The CLI (`episodepipes.sharding.cli`, ``episodepipes-shard``) is a thin layer over these.
"""

from episodepipes.sharding.episode import EpisodeData, EpisodeError, EpisodeReader
from episodepipes.sharding.formats.raw import RawReader
from episodepipes.sharding.formats.readers import open_reader, register_format
from episodepipes.sharding.formats.synthetic import SyntheticReader
from episodepipes.sharding.formats.zarr_reader import ZarrReader
from episodepipes.sharding.merge import merge_jobs
from episodepipes.sharding.write import WriteOptions, WriteResult, write_shards
from episodepipes.sharding.write.encode import EncodeOptions, encode_episode
from episodepipes.sharding.write.writer import ShardWriter

__all__ = [
    "EncodeOptions",
    "EpisodeData",
    "EpisodeError",
    "EpisodeReader",
    "RawReader",
    "ShardWriter",
    "SyntheticReader",
    "WriteOptions",
    "WriteResult",
    "ZarrReader",
    "encode_episode",
    "merge_jobs",
    "open_reader",
    "register_format",
    "write_shards",
]
