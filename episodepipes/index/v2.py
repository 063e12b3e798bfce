"""Index format v2: a small ``index.json`` and memory-mapped ``.npy`` columns beside it.

Version 1 keeps every frame's offset in the JSON, so opening costs time and memory in proportion to the
frames (seconds and hundreds of MB at ten million frames, again in every rank and worker). Version 2
keeps only what is proportional to episodes or smaller in the JSON (shards, schemas, splits, prompts,
fps values, episode ids and extra attributes) and every number in columns with fixed file names
(`format.COLUMNS`), mapped read-only once their headers are checked (`episodepipes.index.columns`): the pages are shared
through the page cache by every process on a machine, and nothing per frame is parsed or copied.

Tables: ``episodes`` (one row per episode: first frame row, length, first segment, schema, split, prompt
and fps codes), ``segments`` (one row per run of an episode's frames in one shard: shard, first frame
row, count), and per frame ``offset``, ``size`` and, when the index says ``"crc32": true``, ``crc32``.
Frame rows are in episode order; an episode's frames are the rows ``first .. first + length``.

Layouts (``layout`` in the JSON; a reader refuses one it does not know by name, so it is never misread):

- ``"members"`` (JPEG shards, and the only layout of v1): a frame is a run of whole tar members at
  ``[offset, offset + size)``, which webdataset's own reader iterates as one sample.
- ``"packed"`` (video-codec shards, `episodepipes.codec.chunk`): an episode is cut into chunks of whole GOPs (at
  most 64 frames or 1 MiB of records, then the next frame where every camera is at a keyframe); a chunk is one tar
  member ``<episode>/<first:06d>.epk`` holding an EPK1 pack of one *record* per frame, back to back. A record is an
  EPK1 pack of a head (per camera in sorted order: ``<u2`` back, ``<u2`` packet count), each camera's packets (frame
  0's include a copied stream's leading packets) or JPEG, and each array's raw row (sorted keys, the index's dtype
  and shape). The json member of the members layout is not stored: readers make it from the index
  (`episodepipes.format.frame_json`). ``offset``/``size`` are the frame's record, and ``crc32`` is zlib.crc32 of
  exactly those bytes (the chunk's tar header, pack table and padding are covered by the shard's sha256 only;
  the pipes never read them). Two more columns: ``member`` (the byte where the frame's chunk member, its tar
  header, starts) and ``key`` (the frame row its decode starts at: the earliest over its cameras, in its chunk).
  Reading frame t is the one range ``[offset[key[t]], offset[t] + size[t])``; a pinned episode reads each chunk's
  records once. Shards are cut only at chunk ends, so a chunk never straddles shards.

Validation: the JSON, the column headers (dtype, shape, file size) and the per-episode and per-segment
tables are checked at open, vectorised, and in the packed layout every frame's ``member`` and ``key`` and its
record's place in its chunk too (`check_packed`; a remote index's per segment on first use). Per-frame values
(offsets going forward within a segment, inside the shard, non-zero sizes) are checked per episode on its first
frame lookup, and for every frame by `verify`, which also checks each column's sha256 against the JSON (and with
``members``, walks every chunk).
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import math
import re
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from episodepipes import safefile
from episodepipes.episode_attrs import BUILTIN, problem
from episodepipes.format import (
    BLOCK,
    COLUMNS,
    EPISODE_COLUMNS,
    FORMAT_NAME,
    INDEX_NAME,
    LAYOUTS,
    MAX_BACK,
    PACKED_COLUMNS,
    npy_bytes,
)
from episodepipes.index import idcols
from episodepipes.index.check import (
    SHA256_HEX,
    U32_CODE,
    IndexFormatError,
    Where,
    check_extras,
    check_fps,
    check_id,
    check_memory,
    check_schema,
    check_shards,
)
from episodepipes.index.columns import release, scanned

FIRST, LENGTH, SEGMENT, SCHEMA, SPLIT, PROMPT, FPS = range(7)  # columns of the episodes table
SHARD, ROW, COUNT = range(3)  # columns of the segments table
EPISODE_KEYS = BUILTIN  # v1 entry fields; no episode attribute takes their names
V2_KEYS = ("layout", "crc32", "schemas", "splits", "prompts", "fps", "ids", "frames", "episode_meta", "attrs",
           "columns")
_MAX_FRAMES = 2**40
_BLOCK_ROWS = 1 << 20  # frames `frame_problem` checks at a time (a few tens of MB)
_TABLE_ROWS = 1 << 15  # rows of the episodes or segments table `check_tables` reads at a time (under 2 MB)
# an in-place index (`index.referenced`) keeps its per-frame columns in this file of its own (`codec.reference_frames`)
REFERENCE_FRAMES = "reference.frames.bin"
_NOT_ID = re.compile(r"[^A-Za-z0-9_\-.\n]")  # a character no episode id has (`check_id`), ids one per line


def _code(table: dict, key: Any, value: Any, values: list) -> int:
    if key not in table:
        table[key] = len(values)
        values.append(value)
    return table[key]


def build(shards: list[dict], episodes: list[dict], options: dict, extra: dict, *,
          offsets: np.ndarray | None = None, crcs: np.ndarray | None = None,
          layout: str = "members") -> tuple[dict, dict[str, np.ndarray]]:
    """The v2 JSON part (without ``columns``) and the columns of v1-style episode entries (with segments).

    ``offsets``/``crcs`` are every segment's offsets (and crc32) back to back when the caller has them already.
    In the ``"packed"`` layout a segment's ``offsets`` are its frames' spans (`episodepipes.codec.chunk.Spans`:
    they tile ``[offsets[0], end)``, which is what merge and resume copy) and it also carries per frame ``heads``,
    ``sizes`` and ``keys``, from which the record columns are made.
    """
    schemas: list[dict] = []
    splits: list[str] = []
    prompts: list[str] = []
    fps: list[float] = []
    codes: tuple[dict, dict, dict, dict] = ({}, {}, {}, {})
    ep = np.zeros((len(episodes), 7), np.uint64)
    segs: list[tuple[int, int, int]] = []
    ends: list[int] = []
    off, crc = array("Q"), array(U32_CODE)
    track, have_crc = crcs is None, True  # without ``crcs``: every segment's own, if every segment has them
    ids, meta = [], []
    row = 0
    for n, e in enumerate(episodes):
        schema = {"cameras": e["cameras"], "arrays": e["arrays"]}
        ep[n] = (row, e["length"], len(segs), _code(codes[0], json.dumps(schema, sort_keys=True), schema, schemas),
                 _code(codes[1], e["split"], e["split"], splits),
                 _code(codes[2], e.get("prompt", ""), e.get("prompt", ""), prompts),
                 _code(codes[3], json.dumps(e["fps"]), e["fps"], fps))  # 30 and 30.0 stay apart: bytes are kept
        ids.append(e["id"])
        for s in e["segments"]:
            segs.append((s["shard"], row, s["count"]))
            ends.append(s["end"])
            if offsets is None or layout == "packed":  # packed: the spans, from which the records are found
                off.extend(s["offsets"])
            if track and have_crc and "crc32" in s:
                crc.extend(s["crc32"])
            have_crc = have_crc and "crc32" in s
            row += s["count"]
        more = {k: v for k, v in e.items() if k not in EPISODE_KEYS}
        if more:
            meta.append([n, more])
    o = np.frombuffer(off, np.uint64) if offsets is None or layout == "packed" else offsets
    seg = np.array(segs, np.uint64).reshape(-1, 3)
    if layout == "packed":
        cols = _packed_columns(episodes, o, ep[:, FIRST])
    else:
        nxt = np.zeros(len(o), np.uint64)
        nxt[:-1] = o[1:]
        nxt[seg[:, ROW] + seg[:, COUNT] - 1] = ends
        size = nxt - o
        if len(size) and size.max() >= 2**32:
            raise ValueError("a frame is larger than 4 GiB, more than an index v2 size holds; use smaller frames")
        cols = {"offset": o, "size": size.astype("<u4")}
    cols = {"episodes": ep, "segments": seg, **cols}
    have_crc = not track or have_crc
    if have_crc:
        cols["crc32"] = np.frombuffer(crc, np.uint32) if crcs is None else crcs
    data = {"format": FORMAT_NAME, "version": 2, "layout": layout, "crc32": have_crc, "options": options,
            "shards": shards, "schemas": schemas, "splits": splits, "prompts": prompts, "fps": fps, "ids": ids,
            "frames": row, "episode_meta": meta, **extra}
    return data, cols


def _packed_columns(episodes: list[dict], spans: np.ndarray, firsts: np.ndarray) -> dict[str, np.ndarray]:
    """offset, size, member and key of the packed layout, from the segments' spans, heads, sizes and keys."""
    def cat(key: str) -> np.ndarray:
        return np.array([x for e in episodes for s in e["segments"] for x in s[key]], np.int64)

    heads, sizes, keys = cat("heads"), cat("sizes"), cat("keys")
    lengths = np.array([e["length"] for e in episodes], np.int64)
    if not (len(heads) == len(sizes) == len(keys) == len(spans)):
        raise ValueError("the packed segments' heads, sizes and keys do not hold one value per frame")
    if len(sizes) and sizes.max() >= 2**32:
        raise ValueError("a frame is larger than 4 GiB, more than an index v2 size holds; use smaller frames")
    starts = np.flatnonzero(heads > 0)
    member = spans[starts][np.maximum(np.searchsorted(starts, np.arange(len(heads)), side="right") - 1, 0)]
    key = keys + np.repeat(firsts.astype(np.int64), lengths)
    return {"offset": spans + heads.astype(np.uint64), "size": sizes.astype("<u4"), "member": member,
            "key": key.astype(np.uint64)}


def packed_spans(cols: Mapping[str, np.ndarray], row: int, count: int, first: int) -> dict[str, Any]:
    """A packed segment's v1-style fields (what `build` takes back): its frames' spans as ``offsets``, ``end``
    after its last chunk's padding, and per frame ``heads``, ``sizes`` and ``keys`` (episode frames)."""
    off = cols["offset"][row:row + count].astype(np.int64)
    size = cols["size"][row:row + count].astype(np.int64)
    member = cols["member"][row:row + count].astype(np.int64)
    start = np.ones(count, bool)
    start[1:] = member[1:] != member[:-1]
    spans = np.where(start, member, off)
    firsts = np.flatnonzero(start)
    data_at = off[firsts] - 8 - 4 * np.diff(np.append(firsts, count))  # each chunk's pack table
    last = np.append(firsts[1:], count) - 1
    member_bytes = off[last] + size[last] - data_at
    end = int(data_at[-1] + member_bytes[-1] + (-member_bytes[-1] % BLOCK))
    return {"offsets": spans.tolist(), "end": end, "heads": (off - spans).tolist(), "sizes": size.tolist(),
            "keys": (cols["key"][row:row + count].astype(np.int64) - first).tolist()}


@dataclass(frozen=True)
class Streamed:
    """A per-frame column `write` streams to its file instead of taking it whole: its shape and its data bytes in
    order, in the column's `episodepipes.format.COLUMNS` dtype (an in-place merge reads them from the jobs' columns
    a chunk at a time, so 10**8 frames are never held in memory)."""

    shape: tuple[int, ...]
    blocks: Iterable[bytes]


def streamed_header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    """The .npy header `npy_bytes` gives a numeric array of this dtype and shape (format 1.0, what numpy writes for
    these), made without the array: `episodepipes.format.npy_header` writes a zero array of the shape to find it,
    800 MB for a 10**8-row column of an in-place merge."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False,
                                               "shape": tuple(shape)})
    return buf.getvalue()


def write(out: Path, data: dict, cols: Mapping[str, np.ndarray | Streamed], *,
          beside: Sequence[tuple[Path, bytes]] = ()) -> bytes:
    """Write the columns, then ``index.json`` (atomically, last); returns the index bytes.

    ``data`` and ``cols`` are what `build` gives: its ``ids`` and ``episode_meta`` lists are written as the ``ids``,
    ``id_order`` and ``attr`` columns and the JSON's ``attrs`` (`episodepipes.index.idcols`), so opening the index
    parses nothing per episode. ``data`` may hold ``attrs`` with those columns in ``cols`` already (an in-place
    merge builds them from its jobs' columns), and a column may be `Streamed`: fsynced and named before the
    others, which are written together with ``index.json``, renamed last. ``beside``: more files the index names
    (side files), written and fsynced in the same batch, so one flush makes them all durable before the rename."""
    if "ids" in data:
        attrs, idc = idcols.build(data["ids"], data["episode_meta"])
        data = dict({k: v for k, v in data.items() if k not in ("ids", "episode_meta")}, attrs=attrs)
        cols = {**cols, **idc}
    info, files = {}, []
    for name, value in cols.items():
        file, dtype, _ = COLUMNS[name]
        if isinstance(value, Streamed):
            h = hashlib.sha256()
            with safefile.replacing(out / file) as f:
                for raw in itertools.chain([streamed_header(np.dtype(dtype), value.shape)], value.blocks):
                    h.update(raw)
                    f.write(raw)
            info[name] = {"dtype": dtype, "shape": list(value.shape), "sha256": h.hexdigest()}
            continue
        dtype = value.dtype.str if name == "ids" else dtype  # "|S<width of the longest id>"
        blob = npy_bytes(np.ascontiguousarray(value, dtype=dtype))
        info[name] = {"dtype": dtype, "shape": list(value.shape), "sha256": hashlib.sha256(blob).hexdigest()}
        files.append((out / file, blob))
    raw = json.dumps(dict(data, columns=info), sort_keys=True, separators=(",", ":")).encode()
    safefile.write_files([*beside, *files, (out / INDEX_NAME, raw)])  # index.json renamed last
    for name in ("crc32", "member", "key"):
        if name not in cols:
            (out / COLUMNS[name][0]).unlink(missing_ok=True)  # a stale one from an earlier write
    return raw


def check_meta(data: Any, file: Path) -> tuple[Where, list[int], list[int]]:
    """The v2 JSON part, field by field; returns (where, shard sizes, shard samples)."""
    w = Where(file)
    sizes, samples = check_shards(w, data)
    if data.get("layout") not in LAYOUTS:
        raise IndexFormatError(f"{file}: layout={data.get('layout')!r} is not one this episodepipes reads "
                               f"{LAYOUTS}; install the episodepipes that wrote it")
    if type(data.get("crc32")) is not bool:
        raise w.fail("the index", f"crc32={data.get('crc32')!r} should be true or false")
    for j, sc in enumerate(w.seq(data, "schemas", "the index")):
        check_schema(w, w.get(sc, "cameras", f"schema {j}"), w.get(sc, "arrays", f"schema {j}"), f"schema {j}")
    for key in ("splits", "prompts"):
        if any(type(x) is not str for x in w.seq(data, key, "the index")):
            raise w.fail("the index", f"{key} should hold strings only")
    for x in w.seq(data, "fps", "the index"):
        check_fps(w, x, "the index's fps list")
    frames = w.num(data, "frames", "the index", high=_MAX_FRAMES)
    if "ids" in data:  # written before the id columns: ids and attributes listed in the JSON
        n = _check_listed_ids(w, data)
    else:
        n = _episode_count(w, data)
        if "episode_meta" in data:
            raise w.fail("the index", "episode_meta is listed but ids are not: attributes live in 'attrs' and the "
                                      "'attr' column")
        if len(w.seq(data, "attrs", "the index")) > n + 1:  # {} and at most one set per episode
            raise w.fail("the index", f"attrs lists {len(data['attrs'])} attribute sets, more than its {n} episodes")
    check_extras(w, data)
    cols = w.get(data, "columns", "the index")
    want = {"episodes", "segments", "offset", "size"} | ({"crc32"} if data["crc32"] else set())
    if "ids" not in data:
        want |= set(EPISODE_COLUMNS)
    if data["layout"] == "packed":
        want |= set(PACKED_COLUMNS)
        for j, sc in enumerate(data["schemas"]):
            if not any("codec" in c for c in sc["cameras"].values()):
                raise w.fail(f"schema {j}", "the packed layout holds video cameras, and this schema has none")
    if frames_apart(data):  # an in-place index's per-frame columns: its frames file, read with its other files
        if data["layout"] != "packed" or not data["crc32"]:
            raise w.fail("the index", f"{REFERENCE_FRAMES} holds a packed index's columns with crc32; this one is "
                                      f"{data['layout']} with crc32={data['crc32']}")
        want -= {"offset", "size", "crc32", *PACKED_COLUMNS}
    if type(cols) is not dict or set(cols) != want:
        raise w.fail("the index", f"columns should name exactly {sorted(want)}")
    for name in sorted(want):
        c, dtype, width = cols[name], COLUMNS[name][1], COLUMNS[name][2]
        at = f"column {name!r}"
        if type(c) is not dict or set(c) != {"dtype", "shape", "sha256"}:  # no file name: it is fixed, never data
            raise w.fail(at, f"should hold exactly dtype, shape and sha256 (its file is always {COLUMNS[name][0]})")
        ok_dtype = idcols.id_width(w.get(c, "dtype", at)) is not None if name == "ids" else c["dtype"] == dtype
        if not SHA256_HEX.fullmatch(str(w.get(c, "sha256", at))) or not ok_dtype:
            raise w.fail(at, f"should have a sha256 of 64 hex digits and dtype {dtype!r}"
                             + (f"<width up to {idcols.MAX_ID_BYTES}>" if name == "ids" else ""))
        shape = w.seq(c, "shape", at)
        rows = {"episodes": n, "ids": n, "id_order": n, "attr": n, "offset": frames, "size": frames, "crc32": frames,
                "member": frames, "key": frames}.get(name)
        if any(type(x) is not int or x < 0 for x in shape) or len(shape) != (2 if width else 1) \
                or (width and shape[1] != width) or (rows is not None and shape[0] != rows):
            raise w.fail(at, f"shape={shape!r} should be [{rows if rows is not None else 'segments'}"
                             f"{', ' + str(width) if width else ''}]")
    # A frame takes at least a tar header (members) or a byte (a packed record) of its shard, and frames do not
    # overlap (`frame_problem`): so the shard sizes bound every count the columns declare, before any is mapped.
    least = BLOCK if data["layout"] == "members" else 1
    if sum(samples) != frames:
        raise w.fail("the index", f"frames={frames}, but the shards hold samples={sum(samples)} in all")
    for i, (size, count) in enumerate(zip(sizes, samples)):
        if count * least > size:
            raise w.fail(f"shard {i}", f"samples={count} frames of at least {least} bytes each do not fit in its "
                                       f"bytes={size}")
    segs, most = cols["segments"]["shape"][0], min(frames, n * len(sizes))
    if not n <= segs <= most:  # every episode has a segment per shard it is in, of a frame at least
        raise w.fail("column 'segments'", f"shape[0]={segs} should be at least the {n} episodes and at most "
                                          f"{most}, the frames and the episodes times the shards")
    check_memory(file, "checking its tables", 64 * n + 48 * segs
                 + (160 * frames if data["layout"] == "packed" else 0))  # what check_tables allocates
    return w, sizes, samples


def frames_apart(data: dict) -> bool:
    """Whether an index keeps its per-frame columns in `REFERENCE_FRAMES` (an in-place index written since)."""
    field = data.get("reference")
    return type(field) is dict and type(field.get("hashes")) is dict and REFERENCE_FRAMES in field["hashes"]


def _check_listed_ids(w: Where, data: dict) -> int:
    """An index that lists its ids and attributes in the JSON (written before the id columns): both checked
    here, per episode (what such an index has always cost); returns the number of episodes."""
    if "attrs" in data:
        raise w.fail("the index", "it lists both ids and attrs; one writer writes one or the other")
    ids = w.seq(data, "ids", "the index")
    try:  # one C-level pass over every id; the loop below only runs to name a bad one
        text = "\n" + "\n".join(ids) + "\n"  # no id may be empty, or start or end with a dot
        ok = not ids or (_NOT_ID.search(text) is None and "\n\n" not in text and "\n." not in text
                         and ".\n" not in text)
    except TypeError:
        ok = False
    if not ok:
        for k, eid in enumerate(ids):
            if type(eid) is not str:
                raise w.fail(f"episode {k}", f"id={eid!r} should be a string")
            check_id(w, eid, f"episode {eid!r}")
    if len(set(ids)) != len(ids):
        seen: set[str] = set()
        dup = next(i for i in ids if i in seen or seen.add(i))
        raise w.fail(f"episode {dup!r}", "this id appears twice; every episode needs its own id")
    last = -1
    for entry in w.seq(data, "episode_meta", "the index"):
        if type(entry) is not list or len(entry) != 2 or type(entry[0]) is not int or not last < entry[0] < len(ids) \
                or type(entry[1]) is not dict or any(k in EPISODE_KEYS for k in entry[1]):
            raise w.fail("the index", f"episode_meta entry {str(entry)[:60]!r} should be [episode number, "
                                      "{attribute: value}], in order, naming no built-in field")
        why = problem(entry[1])
        if why:
            raise w.fail(f"episode {ids[entry[0]]!r}", f"episode_meta {why}")
        last = entry[0]
    return len(ids)


def _episode_count(w: Where, data: dict) -> int:
    """The episodes an index with id columns declares (its episodes table's rows), at most its frames."""
    shape = w.seq(w.get(w.get(data, "columns", "the index"), "episodes", "the index's columns"), "shape",
                  "column 'episodes'")
    n = shape[0] if shape else None
    if type(n) is not int or not 0 <= n <= data["frames"]:
        raise w.fail("column 'episodes'", f"shape={shape!r} should start with the number of episodes, at most "
                                          f"the {data['frames']} frames")
    return n


def check_attrs(w: Where, cols: Mapping[str, np.ndarray], attrs: list) -> None:
    """Each distinct attribute set of ``attrs`` (`episodepipes.episode_attrs`), named by the first episode that has
    it; then the id columns (`episodepipes.index.idcols.check`)."""
    idcols.check(w, cols, attrs)
    for k, a in enumerate(attrs):
        why = problem(a) or (f"attribute {next(x for x in a if x in EPISODE_KEYS)!r} is a built-in episode field"
                             if isinstance(a, dict) and any(x in EPISODE_KEYS for x in a) else None)
        if why:
            users = np.flatnonzero(cols["attr"] == k)
            at = f"episode {idcols.id_text(cols['ids'], int(users[0]))!r}" if len(users) else f"attrs entry {k}"
            raise w.fail(at, f"episode_meta {why}")


def check_tables(w: Where, data: dict, cols: dict[str, np.ndarray], sizes: list[int], samples: list[int]) -> None:
    """The episodes and segments tables, vectorised: rows tile the frames, segments tile the episodes. ``cols``
    holds the checked id columns (`check_attrs`, or built from the JSON's list), which the messages name.

    Read a block of whole rows at a time (`_TABLE_ROWS`): a column of a row-major table is strided, and passes over
    a block that stays in cache cost a fraction of passes over the whole mapped table, nor grow what is allocated."""
    ep, seg, frames = cols["episodes"], cols["segments"], data["frames"]
    n, ns = len(ep), len(seg)
    if n == 0 or ns == 0:
        if n or ns or frames:
            raise w.fail("the index", f"{n} episodes, {ns} segments and {frames} frames do not go together")
        return

    def name(what: str, k: int) -> str:
        return f"episode {idcols.id_text(cols['ids'], k)!r}" if what == "episode" else f"segment {k}"

    def tiles(what: str, table: np.ndarray, first_col: int, count_col: int) -> None:
        end = 0  # rows tile the frames: each starts where the one before ends, holds a frame at least, none past
        for a, blk in scanned(table, _TABLE_ROWS):
            f, c = blk[:, first_col], blk[:, count_col]
            e = f + c
            prev = np.empty_like(f)
            prev[0], prev[1:] = end, e[:-1]
            ok = (c >= 1) & (e > f) & (e <= frames) & (f == prev)
            if not ok.all():
                raise w.fail(name(what, a + int(np.argmax(~ok))), "its first frame row and count should follow the "
                             f"previous one's, and all of them should hold the index's {frames} frames")
            end = int(e[-1])
        if end != frames:
            raise w.fail(name(what, 0), "its first frame row and count should follow the previous one's, and all "
                                        f"of them should hold the index's {frames} frames")
    tiles("episode", ep, FIRST, LENGTH)
    tiles("segment", seg, ROW, COUNT)
    counts = np.array([0, 0, 0, len(data["schemas"]), len(data["splits"]), len(data["prompts"]), len(data["fps"])],
                      np.uint64)
    starts = np.zeros(ns, bool)
    last = -1
    for a, blk in scanned(ep, _TABLE_ROWS):
        first = blk[:, SEGMENT]
        prev = np.empty(len(first), np.int64)
        prev[0], prev[1:] = last, first[:-1].astype(np.int64)
        if (a == 0 and first[0] != 0) or not (first.astype(np.int64) > prev).all() or int(first[-1]) >= ns \
                or not (seg[first, ROW] == blk[:, FIRST]).all():
            raise w.fail("the episodes table", "each episode's first segment should start at its first frame row")
        last = int(first[-1])
        starts[first] = True
        over = blk[:, SCHEMA:] >= counts[SCHEMA:]
        if over.any():
            k, col = np.argwhere(over)[0]
            what = ("schema", "split", "prompt", "fps")[col]
            raise w.fail(name("episode", a + int(k)), f"its {what} code is not below the {counts[SCHEMA + col]} "
                                                      "in the index")
    held = np.zeros(len(sizes), np.float64)
    last_shard = -1
    for a, blk in scanned(seg, _TABLE_ROWS):
        shard = blk[:, SHARD]
        if (shard >= len(sizes)).any():
            raise w.fail(f"segment {a + int(np.argmax(shard >= len(sizes)))}", f"shard should be below {len(sizes)}")
        prev = np.empty(len(shard), np.int64)
        prev[0], prev[1:] = last_shard, shard[:-1].astype(np.int64)
        bad = ~(shard.astype(np.int64) > prev) & ~starts[a:a + len(blk)]
        if a == 0:
            bad[0] = False
        if bad.any():
            raise w.fail(f"segment {a + int(np.argmax(bad))}", "shard should be after the previous segment's shard")
        last_shard = int(shard[-1])
        held += np.bincount(shard.astype(np.int64), weights=blk[:, COUNT].astype(np.float64), minlength=len(sizes))
    for i in np.flatnonzero(held != np.asarray(samples, np.float64)):
        raise w.fail(f"shard {i}", f"samples={samples[i]} but the segments put {int(held[i])} frames in it")
    if data["layout"] == "packed":
        check_packed(w, cols, np.asarray(sizes, np.int64), idcols.IdList(cols["ids"], cols["id_order"]))
        release(*(cols[name] for name in PACKED_COLUMNS + ("offset", "size") if name in cols))  # read whole


def check_packed(w: Where, cols: dict[str, np.ndarray], shard_bytes: np.ndarray, ids: Sequence[str]) -> None:
    """The packed layout's per-frame columns, vectorised over every frame: each chunk's records lie back to back
    after its tar header and pack table, inside its shard, chunks go forward, and each frame's decode starts within
    its chunk (`episodepipes.codec.chunk`).

    Checked a run of whole segments (about `_PACKED_ROWS` frames) at a time, each run's pages released after (the
    row before a run carried into the next, as `packed_problem` does): what this holds does not grow with the
    frames (whole, it was ~60 bytes a frame: gigabytes at 10**8 frames).

    A remote index's per-frame columns are read by range (`episodepipes.remote.framecolumns`): reading them whole
    here would cost every frame's rows at open, so each segment is checked on its first use instead
    (`packed_problem`, beside `frame_problem`)."""
    off = cols["offset"]
    if not isinstance(off, np.ndarray) or not len(off):
        return
    seg, ep = cols["segments"], cols["episodes"]
    seg_row = seg[:, ROW].astype(np.int64)  # one int per segment: strictly increasing from 0 (check_tables)
    j, prev = 0, None
    while j < len(seg):
        k = max(j + 1, int(np.searchsorted(seg_row, seg_row[j] + _PACKED_ROWS, side="left")))
        r0, r1 = int(seg_row[j]), int(seg_row[k]) if k < len(seg) else len(off)
        count = seg[j:k, COUNT].astype(np.int64)
        new_seg = np.zeros(r1 - r0, bool)
        new_seg[seg_row[j:k] - r0] = True
        sh = np.repeat(seg[j:k, SHARD].astype(np.int64), count)
        o, size = off[r0:r1].astype(np.int64), cols["size"][r0:r1].astype(np.int64)
        got = _packed_rows(o, size, cols["member"][r0:r1].astype(np.int64), cols["key"][r0:r1], new_seg, sh,
                           shard_bytes[sh], r0, prev)
        if got is not None:
            r, why = got
            n = int(np.searchsorted(ep[:, FIRST], r, side="right")) - 1
            raise w.fail(f"frame row {r} (episode {ids[n]!r}, frame {r - int(ep[n, FIRST])})", why)
        prev = (int(o[-1] + size[-1]), int(sh[-1]))
        release(*(cols[name][r0:r1] for name in ("offset", "size", "member", "key")))
        j = k


_PACKED_ROWS = 1 << 20  # frames of whole segments `check_packed` checks at a time


def packed_problem(cols: Mapping[str, Any], j: int, shard_bytes: int) -> str | None:
    """`check_packed` of segment ``j`` alone, for an index whose per-frame columns are read by range (a remote one:
    checked on the segment's first use, as `frame_problem` is); None where `check_packed` checked every frame at
    open. The row before the segment is read too: a chunk goes forward from the previous record."""
    if isinstance(cols["offset"], np.ndarray):
        return None
    seg = cols["segments"]
    r0, count, shard = int(seg[j, ROW]), int(seg[j, COUNT]), int(seg[j, SHARD])
    if count < 1:
        return None  # the segments table's own check names it
    a = max(r0 - 1, 0)
    off, size = cols["offset"][a:r0 + count].astype(np.int64), cols["size"][a:r0 + count].astype(np.int64)
    member, key = cols["member"][a:r0 + count].astype(np.int64), np.asarray(cols["key"][r0:r0 + count])
    prev = None if a == r0 else (int(off[0] + size[0]), int(seg[j - 1, SHARD]))
    new_seg = np.zeros(count, bool)
    new_seg[0] = True
    sh = np.full(count, shard, np.int64)
    got = _packed_rows(off[r0 - a:], size[r0 - a:], member[r0 - a:], key, new_seg, sh, np.full(count, shard_bytes), r0,
                        prev)
    return None if got is None else f"frame {got[0] - r0} of the segment: {got[1]}"


def _packed_rows(off: np.ndarray, size: np.ndarray, member: np.ndarray, key: np.ndarray, new_seg: np.ndarray,
                 sh: np.ndarray, shard_bytes: np.ndarray, row0: int,
                 prev: tuple[int, int] | None) -> tuple[int, str] | None:
    """(first bad row, why) of rows ``row0 ..`` (whole segments: a chunk never crosses one) of a packed index, or
    None. ``new_seg``: which rows start a segment; ``sh``: each row's shard and ``shard_bytes`` its size; ``prev``:
    the (record end, shard) of row ``row0 - 1``, None at row 0."""
    end = off + size
    starts = new_seg.copy()
    starts[1:] |= member[1:] != member[:-1]
    record = (size >= 1) & (end <= shard_bytes)
    record[1:] &= starts[1:] | (off[1:] == end[:-1])  # back to back within a chunk
    chunk = (member >= 0) & (member + BLOCK <= off)
    # Shards are written one after another, so a chunk is in a later shard than the previous row's or after its
    # record in the same one, at an episode's start too (tar headers are 512-byte aligned: only this stops an
    # episode's member pointing back at the previous episode's last chunk).
    chunk[1:] &= ~starts[1:] | (sh[1:] > sh[:-1]) | ((sh[1:] == sh[:-1]) & (member[1:] >= end[:-1]))
    if prev is not None:
        chunk[0] &= bool(sh[0] > prev[1] or (sh[0] == prev[1] and member[0] >= prev[0]))
    first = np.flatnonzero(starts)
    count = np.diff(np.append(first, len(off)))
    table = off[first] - 8 - 4 * count - member[first]  # the chunk's tar header(s): whole blocks, at least one
    chunk[first[(table < BLOCK) | (table % BLOCK != 0)]] = False
    rows = np.arange(len(off))
    chunk_first = row0 + first[np.searchsorted(first, rows, side="right") - 1]
    rows += row0
    keyed = (key >= chunk_first.astype(np.uint64)) & (key <= rows.astype(np.uint64)) \
        & (rows - key.astype(np.int64) < MAX_BACK)
    bad = ~(record & chunk & keyed)
    if not bad.any():
        return None
    r = int(np.argmax(bad))
    why = ("offset/size: its record is not inside its shard, back to back after the one before in its chunk"
           if not record[r] else "member: its chunk's tar header is not before its record, after the previous "
           "chunk's records in the same shard, with room for the pack table" if not chunk[r]
           else "key: its key frame is not in its chunk at or before it")
    return row0 + r, f"its {why}, as the packed layout puts them"


def step_bytes(schema: dict) -> int:
    """The bytes one step of a schema's arrays takes: every frame holds at least that many (its members or row)."""
    return sum(np.dtype(a["dtype"]).itemsize * math.prod(a["shape"]) for a in schema["arrays"].values())


def frame_problem(cols: Mapping[str, np.ndarray], j: int, shard_bytes: int, least: int = 0) -> str | None:
    """Why segment ``j``'s frames cannot be read as given (overlapping, backwards, empty, past the shard's end, or
    smaller than ``least``, one step of their arrays, which the pipes would allocate from the schema alone).

    Checked a block of frames at a time: a segment's count comes from a column, and a crafted one (a sparse file)
    may say 2**33 frames, so what this allocates does not grow with it."""
    r0, count = int(cols["segments"][j, ROW]), int(cols["segments"][j, COUNT])
    last_end = None
    for a in range(0, count, _BLOCK_ROWS):
        b = min(a + _BLOCK_ROWS, count)
        why = _block_problem(cols["offset"][r0 + a:r0 + b], cols["size"][r0 + a:r0 + b], least, last_end, a)
        if why:
            return why
        last_end = int(cols["offset"][r0 + b - 1]) + int(cols["size"][r0 + b - 1])
    if last_end is not None and last_end > shard_bytes:
        return f"its frames end at byte {last_end}, after the shard's {shard_bytes} bytes"
    return None


def _block_problem(off: np.ndarray, size: np.ndarray, least: int, last_end: int | None, a: int) -> str | None:
    """`frame_problem` for frames ``a ..`` of a segment, the one before them ending at ``last_end``."""
    end = off + size
    if not (end > off).all():
        return f"frame {a + int(np.argmax(~(end > off)))} of the segment has no bytes or wraps"
    small = size < least
    if small.any():
        k = int(np.argmax(small))
        return (f"frame {a + k} of the segment holds {int(size[k])} bytes, fewer than one step of its "
                f"arrays ({least} bytes by their shapes)")
    if last_end is not None and int(off[0]) < last_end:
        return f"frame {a} of the segment starts before the one before ends"
    back = ~(off[1:] >= end[:-1])
    if back.any():
        return f"frame {a + int(np.argmax(back)) + 1} of the segment starts before the one before ends"
    return None
