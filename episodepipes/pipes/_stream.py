"""Streamed shards: the members of planned items from a URL that webdataset's ``gopen`` opens (``pipe:``, ``http://``).

This is the one place that reads shards without the byte source, and it goes once the remote byte source
(`episodepipes.shardio.open_source` on a URL root) serves every pipe: it reads the planned frames' byte
ranges instead of streaming a shard from its start. Only the caller (``url=``) chooses a stream, never
the index. A streamed frame has no CRC check: webdataset hands over member payloads, not the frame's tar
bytes (headers included) that the CRC covers.
"""

from __future__ import annotations

import io
from collections.abc import Iterator, Sequence
from typing import Any, BinaryIO

from webdataset.gopen import gopen
from webdataset.tariterators import group_by_keys, tar_file_iterator

from episodepipes.format import sample_key
from episodepipes.pipes.plan import Item
from episodepipes.pipes.stats import Stats


def is_local(url: str) -> bool:
    """Whether ``url`` is a local path (or ``file://`` URL), which is read through a byte source, not streamed."""
    return "://" not in url and not url.startswith("pipe:") or url.startswith("file://")


def stream_members(items: Sequence[Item], url: str, stats: Stats) -> Iterator[tuple[Item, dict[str, bytes]]]:
    """``(item, members)`` in plan order from one forward stream of ``url``, stopping after the last wanted sample.

    Closing the generator closes the stream (a ``pipe:`` subprocess, a socket). ``url`` is what the caller's
    ``url=`` callable returned: nothing read from an index reaches ``gopen`` (shard names there are plain file
    names, read through a byte source).
    """
    if not isinstance(url, str):
        raise TypeError(f"url(shard) returned {url!r}; it should return a str (a path, pipe: command or URL)")
    stream = _Counting(gopen(url, "rb"), stats)
    try:
        yield from group(items, tar_file_iterator(stream), url, stats)
    finally:
        stream.close()


def group(items: Sequence[Item], members: Iterator[dict[str, Any]], url: str,
          stats: Stats) -> Iterator[tuple[Item, dict[str, bytes]]]:
    """Items in plan order from samples in file order, reading no further than the last wanted one."""
    wanted = {sample_key(i.episode, i.frame) for i in items}
    samples = group_by_keys(({**m, "__url__": url} for m in members), lcase=False)
    got: dict[str, dict[str, bytes]] = {}
    for item in items:
        key = sample_key(item.episode, item.frame)
        while key not in got:
            s = next(samples, None)
            if s is None:
                raise ValueError(f"shard {url} has no sample {key!r}: truncated or not this index's shard; "
                                 "re-shard it or check with verify=True")
            if s["__key__"] in wanted:
                got[s["__key__"]] = {k: v for k, v in s.items() if not k.startswith("__")}
        stats.add("frames_read")
        yield item, got[key]


class _Counting(io.RawIOBase):
    """A read-only stream wrapper that adds what it reads to ``stats["bytes_read"]``."""

    def __init__(self, raw: BinaryIO, stats: Stats) -> None:
        super().__init__()
        self.raw, self.stats = raw, stats

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n)
        self.stats.add("bytes_read", len(data))
        return data

    def readinto(self, b: Any) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self.raw.close()
        super().close()
