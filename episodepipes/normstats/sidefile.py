"""The statistics side file ``index.stats.bin``: an index's exact statistics, outside its JSON.

The sketches grow with the distinct buckets seen, so as JSON they made ``index.json`` hundreds of MB for
wide arrays and every open parsed them, in every rank and worker, though most opens never ask for them.
Here they are a few little-endian arrays, read only by the first `EpisodeIndex.stats` call and by `verify`.
``index.json`` records the file's size and sha256 (field ``stats_file``); the file's name is fixed, never
taken from data, and it is written (atomically) before the index, so a reader sees a matching pair.

Layout: ten ``.npy`` arrays back to back (each with its own header; never pickle), in this order:
``header`` (uint8: JSON ``{"format", "version", "sub_bits", "entries": [[split, key, shape, count], ...],
"missing": [[split, key, reason], ...]}``), then over the entries' elements in entry order: ``min`` and
``max`` (float64), the exact sums then sums of squares as ``sign`` (int8), ``shift`` (uint16) and ``length``
(uint16) of each odd magnitude ``>> shift``, whose little-endian bytes are back to back in ``blob`` (uint8),
``nkeys`` (uint32: each element's sketch buckets), ``keys`` (each element's first key plus ``KEY_LIMIT``,
then the gaps to its next keys) and ``counts``, both as LEB128 bytes (uint8; mostly one byte a value).
"""

from __future__ import annotations

import hashlib
import io
import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from episodepipes import safefile
from episodepipes.format import npy_bytes
from episodepipes.normstats import _leb128 as leb128
from episodepipes.normstats.exact import KEY_LIMIT, MAX_DIMS, SUB_BITS, ArrayStats, StatsTable

NAME = "index.stats.bin"
FIELD = "stats_file"  # index.json: {"bytes": size, "sha256": hex digest} of NAME
MAGIC = "episodepipes-stats"
_ARRAYS = (("header", ("|u1",)), ("min", ("<f8",)), ("max", ("<f8",)), ("sign", ("|i1",)), ("shift", ("<u2",)),
           ("length", ("<u2",)), ("blob", ("|u1",)), ("nkeys", ("<u4",)), ("keys", ("|u1",)), ("counts", ("|u1",)))
_MAX_INT_BYTES, _MAX_SHIFT = 1024, 8192  # an exact sum of squares has at most ~4,400 bits
_MAX_FILE = 1 << 34
Stats = dict[tuple[str, str], ArrayStats]
Missing = dict[tuple[str, str], str]


def encode(stats: Mapping[tuple[str, str], ArrayStats], missing: Mapping[tuple[str, str], str]) -> bytes:
    """The side file's bytes: deterministic, so equal statistics give equal bytes."""
    order = sorted(stats)
    entries = [[s, k, list(stats[(s, k)].shape), stats[(s, k)].count] for s, k in order]
    head = {"format": MAGIC, "version": 1, "sub_bits": SUB_BITS, "entries": entries,
            "missing": [[s, k, r] for (s, k), r in sorted(missing.items())]}
    accs = [stats[at] for at in order]
    moments = [a.moments() for a in accs]
    lo = [m[2] if a.count else np.full(len(m[0]), np.inf) for a, m in zip(accs, moments)]
    hi = [m[3] if a.count else np.full(len(m[0]), -np.inf) for a, m in zip(accs, moments)]
    ints = [v for m in moments for v in m[0]] + [v for m in moments for v in m[1]]
    sign, shift, length, blob = [], [], [], []
    for v in ints:
        z = (v & -v).bit_length() - 1 if v else 0
        mag = abs(v) >> z
        raw = mag.to_bytes((mag.bit_length() + 7) // 8, "little")
        sign.append((v > 0) - (v < 0))
        shift.append(z)
        length.append(len(raw))
        blob.append(raw)
    keys, counts, nkeys = [], [], []
    for a in accs:
        k, c, ends = a.packed()
        nk = np.diff(ends, prepend=0)
        gaps = np.diff(k, prepend=0)
        starts = (ends - nk)[nk > 0]
        gaps[starts] = k[starts] + KEY_LIMIT
        keys.append(gaps)
        counts.append(c)
        nkeys.append(nk)
    def cat(v: list[np.ndarray], dt: Any) -> np.ndarray:
        return np.concatenate(v).astype(dt) if v else np.zeros(0, dt)

    arrays = [np.frombuffer(json.dumps(head, sort_keys=True, separators=(",", ":")).encode(), np.uint8),
              cat(lo, "<f8"), cat(hi, "<f8"), np.array(sign, "|i1"), np.array(shift, "<u2"), np.array(length, "<u2"),
              np.frombuffer(b"".join(blob), np.uint8), cat(nkeys, "<u4"),
              leb128.encode(cat(keys, np.int64)), leb128.encode(cat(counts, np.int64))]
    return b"".join(npy_bytes(a) for a in arrays)


def _read_arrays(raw: bytes, where: str) -> dict[str, np.ndarray]:
    """Each array of the layout, its header checked (dtype, 1-D, size within the file) before any data is read."""
    buf, out = io.BytesIO(raw), {}
    for name, kinds in _ARRAYS:
        try:
            version = np.lib.format.read_magic(buf)
            if version not in ((1, 0), (2, 0)):
                raise ValueError(f".npy version {version}")
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read(buf)
        except (ValueError, SyntaxError, TypeError, KeyError, OverflowError, EOFError) as e:
            raise ValueError(f"{where}: array {name!r} has no readable .npy header ({e})") from None
        if dtype.str not in kinds or len(shape) != 1 or shape[0] < 0 or fortran:
            raise ValueError(f"{where}: array {name!r} is {dtype.str} of shape {shape}, should be 1-D "
                             f"{'/'.join(kinds)}")
        start, size = buf.tell(), shape[0] * dtype.itemsize
        if start + size > len(raw):
            raise ValueError(f"{where}: array {name!r} declares {shape[0]} values, more than the file holds "
                             "(truncated?)")
        out[name] = np.frombuffer(raw, dtype, shape[0], start)
        buf.seek(start + size)
    if buf.tell() != len(raw):
        raise ValueError(f"{where}: {len(raw) - buf.tell()} bytes follow the last array")
    return out


def _header(a: np.ndarray, where: str) -> tuple[list, Missing]:
    try:
        head = json.loads(a.tobytes())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{where}: the header is not JSON ({e})") from None
    if type(head) is not dict or set(head) != {"format", "version", "sub_bits", "entries", "missing"} \
            or head["format"] != MAGIC or head["version"] != 1 or head["sub_bits"] != SUB_BITS:
        raise ValueError(f"{where}: the header should be a {MAGIC} version 1 object with sub_bits={SUB_BITS}")
    entries, seen = head["entries"], []
    ok = type(entries) is list and all(
        type(e) is list and len(e) == 4 and type(e[0]) is str and type(e[1]) is str and type(e[2]) is list
        and 0 <= len(e[2]) <= 8 and all(type(n) is int and n > 0 for n in e[2]) and math.prod(e[2]) <= MAX_DIMS
        and type(e[3]) is int and 0 <= e[3] < 2**62 for e in entries)
    if ok:
        seen = [(e[0], e[1]) for e in entries]
    if not ok or seen != sorted(set(seen)):
        raise ValueError(f"{where}: header entries should be sorted, distinct [split, key, shape (at most 8 positive "
                         f"ints, {MAX_DIMS} elements), count (a non-negative int)]")
    miss = head["missing"]
    if type(miss) is not list or not all(type(m) is list and len(m) == 3 and all(type(x) is str for x in m)
                                         for m in miss) or len({(m[0], m[1]) for m in miss}) != len(miss):
        raise ValueError(f"{where}: header missing should be distinct [split, key, reason] strings")
    return entries, {(m[0], m[1]): m[2] for m in miss}


def decode(raw: bytes, *, where: str) -> tuple[StatsTable, Missing]:
    """Read `encode`'s bytes back, refusing any field of the wrong dtype, shape, range or count by name."""
    a = _read_arrays(raw, where)
    entries, missing = _header(a["header"], where)
    dims = [math.prod(e[2]) for e in entries]
    d = sum(dims)
    for name, n in (("min", d), ("max", d), ("sign", 2 * d), ("shift", 2 * d), ("length", 2 * d), ("nkeys", d)):
        if len(a[name]) != n:
            raise ValueError(f"{where}: array {name!r} has {len(a[name])} values, the header's entries need {n}")
    sign, shift, length = (a[k].astype(np.int64) for k in ("sign", "shift", "length"))
    zero = sign == 0
    if ((np.abs(sign) > 1) | (shift > _MAX_SHIFT) | (length > _MAX_INT_BYTES) | (zero & ((shift != 0) | (length != 0)))
            | (~zero & (length == 0))).any() or int(length.sum()) != len(a["blob"]):
        raise ValueError(f"{where}: the exact sums' sign, shift and length arrays are out of range or do not "
                         "add up to the blob")
    blob = a["blob"].tobytes()
    ends = np.cumsum(length).tolist()
    ints = []
    for s, z, b, e in zip(sign.tolist(), shift.tolist(), [0, *ends], ends):
        mag = int.from_bytes(blob[b:e], "little")
        if s and (not mag & 1 or blob[e - 1] == 0):
            raise ValueError(f"{where}: an exact sum is not in its canonical form (odd magnitude, no high zero byte)")
        ints.append(s * (mag << z))
    nkeys = a["nkeys"].astype(np.int64)
    keys, counts = (leb128.decode(a[k], k, where) for k in ("keys", "counts"))
    per_count = np.repeat(np.array([e[3] for e in entries], np.int64), dims)
    if (int(nkeys.sum()) != len(keys) or len(counts) != len(keys)
            or (nkeys > np.minimum(per_count, 2 * KEY_LIMIT)).any()):
        raise ValueError(f"{where}: nkeys should count each element's buckets (at most its count), and keys and "
                         "counts should have one value per bucket")
    kend = np.cumsum(nkeys)
    first = (kend - nkeys)[nkeys > 0]  # where each element's keys start
    is_first = np.zeros(len(keys), bool)
    is_first[first] = True
    if (keys >= 2 * KEY_LIMIT).any() or (~is_first & (keys == 0)).any() or (counts <= 0).any():
        raise ValueError(f"{where}: sketch keys should increase within each element, with positive counts")
    cs = np.cumsum(keys)  # below 2**52: fewer than 2**32 keys, each below 2**20
    k = cs - np.repeat((cs - keys)[first], nkeys[nkeys > 0]) - KEY_LIMIT
    if ((k <= -KEY_LIMIT) | (k >= KEY_LIMIT)).any():
        raise ValueError(f"{where}: sketch keys should stay in (-{KEY_LIMIT}, {KEY_LIMIT})")
    owner = np.repeat(np.arange(d), nkeys)
    approx = np.bincount(owner, weights=counts.astype(np.float64), minlength=d)
    exact = np.zeros(d, np.int64)  # int64 cannot wrap here: every count is positive and approx bounds their sum
    exact[nkeys > 0] = np.add.reduceat(counts, first) if len(first) else []
    if (np.abs(approx - per_count) > 1e-6 * per_count + 0.5).any() or (exact != per_count).any():
        raise ValueError(f"{where}: each element's sketch counts should add up to its entry's count")
    lo, hi = a["min"], a["max"]
    seen = per_count > 0
    if not (np.isfinite(lo[seen]).all() and np.isfinite(hi[seen]).all()
            and (lo[~seen] == np.inf).all() and (hi[~seen] == -np.inf).all()):
        raise ValueError(f"{where}: min and max should be finite where an entry has steps, +inf/-inf where not")
    stats, at = {}, 0
    for (split, key, shape, count), n in zip(entries, dims):
        sl = slice(at, at + n)
        kk = slice(int(kend[at] - nkeys[at]) if n else 0, int(kend[at + n - 1]) if n else 0)
        sketch = (k[kk], counts[kk], kend[sl] - kk.start)
        stats[(split, key)] = ArrayStats.from_arrays(
            tuple(shape), count, ints[at:at + n], ints[d + at:d + at + n], lo[sl], hi[sl], sketch,
            where=f"{where}: stats[{split!r}][{key!r}]")
        at += n
    return StatsTable(stats), missing


def descriptor(raw: bytes) -> dict[str, Any]:
    """The index field naming the side file's bytes: ``{FIELD: {"bytes": n, "sha256": hex}}``."""
    return {FIELD: {"bytes": len(raw), "sha256": hashlib.sha256(raw).hexdigest()}}


def check_descriptor(desc: Any, where: str) -> tuple[int, str]:
    """(bytes, sha256) of a ``stats_file`` field, checked."""
    ok = (type(desc) is dict and set(desc) == {"bytes", "sha256"} and type(desc["bytes"]) is int
          and 0 < desc["bytes"] <= _MAX_FILE and type(desc["sha256"]) is str and len(desc["sha256"]) == 64
          and all(c in "0123456789abcdef" for c in desc["sha256"]))
    if not ok:
        raise ValueError(f"{where}: {FIELD} should be {{'bytes': a positive int, 'sha256': 64 hex digits}}")
    return desc["bytes"], desc["sha256"]


def read(read_file: Callable[[], bytes], desc: Any, *, where: str, file: str) -> tuple[StatsTable, Missing]:
    """The side file's statistics: its size and sha256 checked against the index's ``desc`` first, then every
    field. ``read_file`` gives its bytes; ``file`` names it in errors."""
    size, sha = check_descriptor(desc, where)
    try:
        raw = read_file()
    except FileNotFoundError:
        raise ValueError(f"{file} is missing, and {where} needs it") from None
    if len(raw) != size or hashlib.sha256(raw).hexdigest() != sha:
        raise mismatch(file, len(raw), where)
    return decode(raw, where=file)


def mismatch(file: str, size: int, where: str) -> ValueError:
    """The error for a side file of ``size`` bytes that is not the one ``where`` names."""
    return ValueError(f"{file} has {size} bytes or a sha256 that do not match {where}'s {FIELD} "
                      "(changed, swapped or cut short)")


def write(path: Path, stats: Mapping[tuple[str, str], ArrayStats], missing: Mapping[tuple[str, str], str]) -> dict:
    """Write the side file at ``path`` atomically; returns the index field that names its bytes."""
    return write_raw(path, encode(stats, missing))


def write_raw(path: Path, raw: bytes) -> dict:
    """Write `encode`'s bytes ``raw`` as the side file at ``path`` atomically; returns the index field naming them."""
    safefile.write_file(path, raw)
    return descriptor(raw)
