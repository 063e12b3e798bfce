"""`check_index`: every field of a parsed ``index.json`` checked before anything uses it.

An index is data, and data may be crafted: a shard name decides which file is opened (webdataset's
``gopen`` would even run ``pipe:`` names as commands), offsets decide which bytes are read, and
counts and fps feed divisions. So each field must have the type and range the writer gives it, and
anything else is refused with one line naming the file, the episode and the field. Per-frame lists
are checked with C-level passes (``map``), not per-frame Python, so opening stays as fast as parsing.
"""

from __future__ import annotations

import bisect
import functools
import math
import os
import re
from array import array
from pathlib import Path
from typing import Any

import numpy as np

from episodepipes import episode_attrs
from episodepipes.episode_attrs import BUILTIN
from episodepipes.errors import IndexFormatError  # noqa: F401 (re-export)
from episodepipes.format import MAX_FPS, MIN_FPS, finite, fps_in_range

SHARD_NAME = re.compile(r"shard-[0-9]{6,}\.tar")  # what `format.shard_name` writes (ASCII digits: \d takes any)
SHA256_HEX = re.compile(r"[0-9a-f]{64}")
_ID = re.compile(r"[A-Za-z0-9_\-.]+")
_FIELD = re.compile(r"[A-Za-z0-9_\-]+")
_MAX_STEP_BYTES = 2**40  # one step of one array; anything larger is a crafted shape, not data
_MAX_SIDE = 65500  # libjpeg's limit (sharding.write.plan.JPEG_MAX): no camera the writer stores is larger
_MAX_COUNT = 2**63  # bytes and samples of a shard, a source's sides: what the int64 columns and numpy hold
_FIX = "re-shard with write --overwrite"
U32_CODE = next(c for c in "ILQ" if array(c).itemsize == 4)  # the C type code of an unsigned 32-bit int


class Where:
    """The file and the place in it, for error messages."""

    def __init__(self, file: Path) -> None:
        self.file = file
        self._offsets = array("Q")  # every segment's offsets, back to back
        self._starts: list[int] = []  # where each segment's run starts in _offsets
        self._places: list[str] = []  # and its name, for the message
        self._crcs = array(U32_CODE)
        self._crc_lists: list[tuple[str, list]] = []

    def fail(self, where: str, message: str) -> IndexFormatError:
        return IndexFormatError(f"{self.file} is damaged: {where}: {message}; {_FIX}")

    def get(self, d: Any, key: str, where: str) -> Any:
        if not isinstance(d, dict):
            raise self.fail(where, f"expected an object, found {type(d).__name__}")
        if key not in d:
            raise IndexFormatError(f"{self.file} is damaged: {where} has no {key!r}; {_FIX}")
        return d[key]

    def num(self, d: dict, key: str, where: str, *, low: int = 0, high: int | None = None) -> int:
        v = self.get(d, key, where)
        if type(v) is not int or v < low or (high is not None and v >= high):  # bool is not an int here
            bound = f" below {high}" if high is not None else ""
            raise self.fail(where, f"{key}={v!r} should be an integer >= {low}{bound}")
        return v

    def text(self, d: dict, key: str, where: str) -> str:
        v = self.get(d, key, where)
        if type(v) is not str:
            raise self.fail(where, f"{key}={v!r} should be a string")
        return v

    def seq(self, d: dict, key: str, where: str) -> list:
        v = self.get(d, key, where)
        if type(v) is not list:
            raise self.fail(where, f"{key} should be a list, found {type(v).__name__}")
        return v

    def offsets(self, s: dict, where: str, count: int) -> list[int]:
        """``count`` non-negative ints; `array` refuses floats, strings and negatives in C, and collects them
        so that `increasing` checks every segment's order in one numpy pass at the end."""
        v = self.seq(s, "offsets", where)
        if len(v) != count:
            raise self.fail(where, f"offsets has {len(v)} entries, count={count}")
        try:
            self._offsets.fromlist(v)
        except (TypeError, OverflowError):
            raise self.fail(where, "offsets should hold non-negative integers only") from None
        if any(type(x) is not int for x in v[:2]):  # a bool is 0 or 1: in an increasing list, one of the first two
            raise self.fail(where, "offsets should hold integers, not booleans")
        self._starts.append(len(self._offsets) - count)
        self._places.append(where)
        return v

    def increasing(self) -> None:
        """Every segment's offsets strictly increase (checked for all segments at once)."""
        a = np.frombuffer(self._offsets, np.uint64)
        bad = a[1:] <= a[:-1]
        bad[np.asarray(self._starts[1:], np.int64) - 1] = False  # one segment's end and the next one's start
        if bad.any():
            k = bisect.bisect_right(self._starts, int(bad.argmax()) + 1) - 1
            raise self.fail(self._places[k], "offsets should be strictly increasing")

    def crcs(self, s: dict, where: str, count: int) -> None:
        v = self.seq(s, "crc32", where)
        if len(v) != count:
            raise self.fail(where, f"crc32 has {len(v)} entries, count={count}")
        try:
            self._crcs.fromlist(v)  # refuses floats, strings, negatives and values of 2**32 or more
        except (TypeError, OverflowError):
            raise self.fail(where, "crc32 should hold integers in [0, 2**32)") from None
        self._crc_lists.append((where, v))

    def no_bool_crcs(self) -> None:
        """A bool is 0 or 1: look at the types only if some crc32 is (a real crc32 is 0 or 1 once in 2**31)."""
        if len(self._crcs) and (np.frombuffer(self._crcs, np.uint32) <= 1).any():
            for where, v in self._crc_lists:
                if any(type(x) is not int for x in v):
                    raise self.fail(where, "crc32 should hold integers, not booleans")


def check_index(data: Any, file: Path) -> tuple[np.ndarray, np.ndarray | None]:
    """Raise `IndexFormatError` for the first field of a v1 ``data`` that the readers could not use safely.

    Returns every segment's offsets back to back (uint64), and their crc32 (uint32) when every segment has them.
    """
    w = Where(file)
    sizes, samples = check_shards(w, data)
    held = [0] * len(sizes)
    ids: set[str] = set()
    for k, e in enumerate(w.seq(data, "episodes", "the index")):
        eid = _episode(w, e, k, sizes, held)
        if eid in ids:
            raise w.fail(f"episode {eid!r}", "this id appears twice; every episode needs its own id")
        ids.add(eid)
    w.increasing()
    w.no_bool_crcs()
    for i, (n, m) in enumerate(zip(held, samples)):
        if n != m:
            raise w.fail(f"shard {i}", f"samples={m} but the episodes' segments put {n} frames in it")
    check_extras(w, data)
    offsets = np.frombuffer(w._offsets, np.uint64)
    crcs = np.frombuffer(w._crcs, np.uint32) if len(w._crcs) == len(offsets) else None
    return offsets, crcs


def check_shards(w: Where, data: Any) -> tuple[list[int], list[int]]:
    """The shard list: plain file names, sizes, sample counts and sha256 digests; returns (sizes, samples)."""
    shards = w.seq(data, "shards", "the index")
    sizes, samples, names = [], [], set()
    for i, s in enumerate(shards):
        where = f"shard {i}"
        name = w.text(s, "name", where)
        if not SHARD_NAME.fullmatch(name):
            raise w.fail(where, f"name={name!r} is not a shard file name like 'shard-000000.tar' (no paths, no "
                                "URLs, no commands: a remote copy is chosen by the caller's root, never by the index)")
        if name in names:
            raise w.fail(where, f"name={name!r} appears twice in the shard list")
        names.add(name)
        sizes.append(w.num(s, "bytes", where, high=_MAX_COUNT))
        samples.append(w.num(s, "samples", where, high=_MAX_COUNT))
        sha = w.text(s, "sha256", where)
        if not SHA256_HEX.fullmatch(sha):
            raise w.fail(where, f"sha256={sha!r} should be 64 lowercase hex digits")
    return sizes, samples


def check_extras(w: Where, data: dict) -> None:
    """``options`` and ``skipped``, which both versions carry ("job" is merge's to check)."""
    for key, kind in (("options", dict), ("skipped", list)):
        if key in data and type(data[key]) is not kind:
            raise w.fail("the index", f"{key} should be a {kind.__name__}, found {type(data[key]).__name__}")
    if "shard_size" in data.get("options", {}):  # merge re-cuts shards with it
        w.num(data["options"], "shard_size", "options", low=1)
    for i, s in enumerate(data.get("skipped", [])):
        w.text(s, "id", f"skipped entry {i}")
        w.text(s, "error", f"skipped entry {i}")


def check_id(w: Where, eid: str, where: str) -> None:
    if not _ID.fullmatch(eid) or eid[0] == "." or eid[-1] == ".":  # what `format.safe_episode_id` keeps
        raise w.fail(where, "the id is not a tar-safe episode id (letters, digits, '_', '-', '.')")


def memory_bound() -> int:
    """Half of this machine's physical memory: what checking or reading an index may take at most. Any larger need
    comes from counts a crafted index declares (a sparse column costs no disk), so it is refused before it is
    allocated instead of ending in a MemoryError or taking the machine."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2


def check_memory(file: Path | str, what: str, need: int) -> None:
    """Refuse, naming ``file``, an index whose ``what`` would take ``need`` bytes, more than `memory_bound`."""
    bound = memory_bound()
    if need > bound:
        raise IndexFormatError(f"{file}: {what} would take {need / 2**30:.1f} GiB of memory, more than the "
                               f"{bound / 2**30:.1f} GiB bound (half of this machine's); the counts it declares "
                               f"are crafted or damaged: {_FIX} (a genuine dataset this large: split it in two)")


def check_fps(w: Where, fps: Any, where: str) -> None:
    if type(fps) not in (int, float) or not finite(fps) or not fps_in_range(fps):
        raise w.fail(where, f"fps={fps!r} should be a number of frames per second from {MIN_FPS} to {MAX_FPS} "
                            "(what a video container stores)")


VIDEO_CODECS = ("av1", "h264", "hevc", "vp9")  # codec.stream.DECODERS' keys (not imported: it pulls in PyAV)
_MAX_EXTRADATA = 1 << 16
_HEX = re.compile(r"(?:[0-9a-f]{2})+")


def check_schema(w: Where, cameras: Any, arrays: Any, where: str) -> None:
    """An episode's (v1) or a schema's (v2) cameras and arrays."""
    if type(cameras) is not dict or not cameras:
        raise w.fail(where, "cameras should be a non-empty object")
    for name, c in cameras.items():
        at = f"{where} camera {name!r}"
        _field_name(w, name, at)
        w.num(c, "height", at, low=1, high=_MAX_SIDE + 1)  # the pipes allocate (3, height, width) per frame
        w.num(c, "width", at, low=1, high=_MAX_SIDE + 1)
        if "source_height" in c or "source_width" in c:
            w.num(c, "source_height", at, low=1, high=_MAX_COUNT)
            w.num(c, "source_width", at, low=1, high=_MAX_COUNT)
        if "source" in c:
            w.text(c, "source", at)
        if "codec" in c or "gop" in c:  # a video camera: both, from the codecs the decoder knows
            if w.text(c, "codec", at) not in VIDEO_CODECS:
                raise w.fail(at, f"codec {c['codec']!r} should be one of {list(VIDEO_CODECS)}")
            w.num(c, "gop", at, low=1, high=1001)
        if "extradata" in c:  # a copied stream's decoder setup (avcC, hvcC): hex, bounded
            x = w.text(c, "extradata", at)
            if "codec" not in c or not 0 < len(x) <= 2 * _MAX_EXTRADATA or not _HEX.fullmatch(x):
                raise w.fail(at, f"extradata should be at most {_MAX_EXTRADATA} bytes as lowercase hex, "
                                 "on a video camera")
    if type(arrays) is not dict:
        raise w.fail(where, "arrays should be an object")
    for name, a in arrays.items():
        _array(w, name, a, f"{where} array {name!r}")


def _episode(w: Where, e: Any, k: int, sizes: list[int], held: list[int]) -> str:
    eid = w.text(e, "id", f"episode {k}")
    where = f"episode {eid!r}"
    check_id(w, eid, where)
    w.text(e, "split", where)
    if "prompt" in e:
        w.text(e, "prompt", where)
    length = w.num(e, "length", where, low=1)
    check_fps(w, w.get(e, "fps", where), where)
    check_schema(w, w.get(e, "cameras", where), w.get(e, "arrays", where), where)
    _segments(w, w.seq(e, "segments", where), where, length, sizes, held)
    if len(e) > len(BUILTIN) - 1:  # more keys than the fields: v1 keeps attributes beside them
        why = episode_attrs.problem({k: v for k, v in e.items() if k not in BUILTIN})
        if why:
            raise w.fail(where, why)
    return eid


def _field_name(w: Where, name: str, where: str) -> None:
    if not _FIELD.fullmatch(name):  # what `format.safe_field` keeps
        raise w.fail(where, "the name is not a tar-safe field name (letters, digits, '_', '-')")


def _array(w: Where, name: str, a: Any, where: str) -> None:
    _field_name(w, name, where)
    text = w.text(a, "dtype", where)
    dt = _dtype(text)
    if dt is None:
        raise w.fail(where, f"dtype={text!r} is not a numpy dtype")
    if dt.hasobject or dt.kind in "OVT" or dt.fields is not None:
        raise w.fail(where, f"dtype={text!r} cannot be read exactly from .npy without pickle")
    shape = w.seq(a, "shape", where)
    if any(type(n) is not int or n < 0 for n in shape) or len(shape) > 32:
        raise w.fail(where, f"shape={shape!r} should be a list of at most 32 non-negative integers")
    if math.prod(shape) * dt.itemsize > _MAX_STEP_BYTES:
        raise w.fail(where, f"shape={shape!r} of {dt} is larger than any step could be")
    if "source" in a:
        w.text(a, "source", where)


@functools.lru_cache(maxsize=256)  # a dataset has a few dtypes, each written in every episode
def _dtype(text: str) -> np.dtype | None:
    try:
        return np.dtype(text)
    except (TypeError, ValueError, SyntaxError):
        return None


def _segments(w: Where, segs: list, where: str, length: int, sizes: list[int], held: list[int]) -> None:
    if not segs:
        raise w.fail(where, "segments is empty")
    first, last_shard = 0, -1
    for j, s in enumerate(segs):
        at = f"{where} segment {j}"
        shard = w.num(s, "shard", at, high=len(sizes))
        if shard <= last_shard:
            raise w.fail(at, f"shard={shard} should be after the previous segment's shard {last_shard}")
        if w.num(s, "first", at) != first:
            raise w.fail(at, f"first={s['first']} should be {first}, where the previous segment ends")
        count = w.num(s, "count", at, low=1)
        offsets = w.offsets(s, at, count)
        end = w.num(s, "end", at)
        if end <= offsets[-1] or end > sizes[shard]:
            raise w.fail(at, f"end={end} should be after the last frame's offset {offsets[-1]} and within the "
                             f"shard's {sizes[shard]} bytes")
        if "crc32" in s:
            w.crcs(s, at, count)
        held[shard] += count
        first, last_shard = first + count, shard
    if first != length:
        raise w.fail(where, f"the segments hold {first} frames, length={length}")
