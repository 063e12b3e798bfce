"""Shard format v1: names and byte layout shared by the writer and the readers.

One sample is one frame of one episode. Its tar members are named
``<episode_id>/<frame:06d>.<field>`` so that webdataset's ``base_plus_ext`` groups them by
``<episode_id>/<frame:06d>``. Fields are ``<camera>.jpg``, ``<array_key>.npy`` and ``json``.
"""

from __future__ import annotations

import io
import re
import tarfile

import numpy as np

FORMAT_NAME = "episodepipes-shards"
FORMAT_VERSION = 1
INDEX_NAME = "index.json"
BLOCK = 512

_SAFE = re.compile(r"[^A-Za-z0-9_\-]")
_SAFE_ID = re.compile(r"[^A-Za-z0-9_\-.]")


def shard_name(i: int) -> str:
    """File name of the i-th shard."""
    return f"shard-{i:06d}.tar"


def safe_field(name: str) -> str:
    """A camera or array name usable as a tar field: no dots, slashes or spaces."""
    out = _SAFE.sub("_", name)
    if not out:
        raise ValueError(f"name {name!r} has no usable characters; rename it")
    return out


def safe_episode_id(name: str) -> str:
    """An episode id usable as the directory part of a tar member name."""
    out = _SAFE_ID.sub("_", str(name)).strip(".")
    if not out:
        raise ValueError(f"episode id {name!r} has no usable characters; rename it")
    return out


def sample_key(episode_id: str, frame: int) -> str:
    return f"{episode_id}/{frame:06d}"


def tar_member(name: str, data: bytes) -> bytes:
    """One tar member (header, data, padding) with fixed metadata, so output is byte-reproducible."""
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 0
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    header = info.tobuf(format=tarfile.GNU_FORMAT, encoding="utf-8", errors="strict")
    pad = (-len(data)) % BLOCK
    return header + data + b"\0" * pad


TAR_END = b"\0" * (2 * BLOCK)


def npy_bytes(array: np.ndarray) -> bytes:
    """Lossless, deterministic .npy encoding of one array."""
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.ascontiguousarray(array), allow_pickle=False)
    return buf.getvalue()


def npy_load(data: bytes) -> np.ndarray:
    return np.lib.format.read_array(io.BytesIO(data), allow_pickle=False)
