"""Local shards mapped read-only for `TrainReader`: a frame's bytes are a slice of the mapping.

Why not ``os.pread``: the read itself is cheap, but every call releases the GIL, and the thread that
reads samples (the one feeding the decode workers) then waits to get it back behind the decode threads'
Python, once per read; a window of 16 array steps makes dozens of reads per sample. A slice of a mapping
makes no call and copies nothing; the decoder reads the JPEG straight from the page cache.

A mapping is dropped by `MappedShards.close` (the samples still holding slices keep theirs alive until
they are gone). A range past the end of a file goes to the byte source, which raises its "truncated"
error naming the file. The shards must not shrink while mapped: finished shards never change in place
(they are written as ``.tmp`` and renamed), and a file cut short under a running reader would fault.
"""

from __future__ import annotations

import mmap

from episodepipes.shardio import LocalSource


class MappedShards:
    """``read(name, offset, size)`` of `LocalSource`, as memoryviews of mappings made on first use."""

    def __init__(self, source: LocalSource) -> None:
        self.source = source
        self._maps: dict[str, memoryview] = {}

    def read(self, name: str, offset: int, size: int) -> memoryview | bytes:
        view = self._maps.get(name)
        if view is None:
            view = self._map(name)
        if offset < 0 or size < 0 or offset + size > len(view):
            return self.source.read(name, offset, size)  # its error names the file and the range
        return view[offset:offset + size]

    def _map(self, name: str) -> memoryview:
        size = self.source.size(name)  # a missing file is the source's error
        if size == 0:
            view = memoryview(b"")
        else:
            # the source's own descriptor, checked to be a regular file: a FIFO opened again by name would block
            view = memoryview(mmap.mmap(self.source.fileno(name), size, access=mmap.ACCESS_READ))
        self._maps[name] = view
        return view

    def close(self) -> None:
        """Forget the mappings (each is unmapped once no slice of it is left)."""
        self._maps = {}
