"""The byte source of a ``--codec reference`` index (`episodepipes.codec.reference`): its ``reference`` field
checked, its piece columns read, and the source root the caller gives (or the one the index lives in) opened.

Where the source files are read from is the caller's choice: ``EpisodeIndex.open(OUT, source_root=SRC)`` (a folder,
or an ``s3://``, ``gs://``, ``https://`` root). Without one, an index written inside its source root (``OUT`` a
folder under ``SRC``) reads the folder it lies in, ``up`` folders above its own (the index records that count, never
a path); any other index without a root is refused by name. The index names files only relative to the root, and a
name that is absolute, a URL, or climbs out (``..``, or a link inside a local root pointing out of it) is refused.
"""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path
from typing import Any

import numpy as np

from episodepipes.codec import reference as ref
from episodepipes.codec import reference_blocks
from episodepipes.codec import reference_frames as frames_file
from episodepipes.codec import reference_pieces as pieces_file
from episodepipes.codec.image_pieces import Files, ImageFiles
from episodepipes.index.check import IndexFormatError
from episodepipes.index.v2 import REFERENCE_FRAMES
from episodepipes.shardio import ByteSource, LocalSource, ShardIOError, is_url, open_source

LITERAL_NAME = "reference.literal.bin"  # the literal bytes as they are (indexes written before they were deflated)
LITERAL_BLOCKS = "reference.literal.z"  # ... deflated in blocks (`codec.reference_blocks`)
PIECES_NAME = "reference.pieces.bin"  # the piece table (`codec.reference_pieces`)
IMAGES_NAME = "reference.images.bin"  # the image files, one a frame (`codec.image_pieces.ImageFiles`)
ROWS_NAME = "reference.rows.bin"  # every step's arrays' rows, CRC32 a block (`codec.reference.Pieces.rows_file`)
MAX_ROW = 1 << 24  # bytes of one step's arrays
PIECE_FILES = {k: f"reference.{k}.npy" for k in ref.PIECE_DTYPES}  # as indexes before it kept the table
STALE = "re-index the dataset (episodepipes-shard write SRC OUT --format lerobot --codec reference --overwrite), " \
        "or restore the file"


def check_reference(field: Any, file: str) -> dict:
    """The index's ``reference`` field, every value checked (names, sizes, checksums, counts)."""
    def fail(why: str) -> IndexFormatError:
        return IndexFormatError(f"{file}: reference {why}; re-index the dataset")

    if type(field) is not dict or set(field) - {"files", "hashes", "literal", "pieces", "up", "images", "rows"}:
        raise fail("should be an object of files, hashes, literal, pieces, images, rows and up")
    files = field.get("files")
    if type(files) is not list:
        raise fail("files should be a list")
    out = []
    for k, f in enumerate(files):
        if type(f) is not list or len(f) != 4 or any(type(x) is not int or x < 0 for x in f[1:]) \
                or f[2] >= 2**32 or f[3] >= 2**32 or f[1] >= 2**62:
            raise fail(f"file {k} should be [name, bytes, head crc32, tail crc32]")
        try:
            out.append(ref.FileInfo(ref.check_file(f[0]), f[1], f[2], f[3]))
        except ValueError as e:
            raise fail(f"file {k}: {e}") from None
    if len({f.name for f in out}) != len(out):
        raise fail("files name a file twice")
    hashes = field.get("hashes")
    kinds = ({LITERAL_NAME, PIECES_NAME}, {LITERAL_NAME, *PIECE_FILES.values()})
    images = field.get("images")
    if images is not None:
        if type(images) is not dict or set(images) != {"count", "names"} \
                or not all(type(v) is int and 0 < v < 2**40 for v in images.values()):
            raise fail("images should give the image table's count of files and bytes of names")
        kinds = ({LITERAL_NAME, PIECES_NAME, IMAGES_NAME},)
    rows = field.get("rows")
    if rows is not None:  # the arrays' rows in their own file (an index written before it holds them as literals)
        if type(rows) is not int or not 0 < rows <= MAX_ROW:
            raise fail(f"rows={str(rows)[:20]!r} should be the rows file's bytes a step, 1..{MAX_ROW}")
        kinds = tuple(k | {ROWS_NAME} for k in kinds[:1] + kinds[2:])  # not with the older .npy piece columns
    # since: the literal bytes deflated in blocks, and the per-frame columns in a file of their own
    kinds += tuple(k - {LITERAL_NAME} | {LITERAL_BLOCKS, REFERENCE_FRAMES} for k in kinds if PIECES_NAME in k)
    if type(hashes) is not dict or set(hashes) not in kinds \
            or not all(type(h) is str and len(h) == 64 for h in hashes.values()):
        raise fail(f"hashes should give the sha256 of {sorted(min(kinds, key=len))}")
    for key in ("literal", "pieces"):
        if type(field.get(key)) is not int or not 0 <= field[key] < 2**48:
            raise fail(f"{key} should be a count of bytes or pieces")
    up = field.get("up")
    if up is not None and (type(up) is not int or not 1 <= up <= ref.MAX_DEPTH):
        raise fail(f"up={str(up)[:20]!r} should be 1..{ref.MAX_DEPTH} folders")
    return {**field, "files": out}


def _read(folder: ByteSource, name: str, limit: int, digest: str, file: str) -> bytes:
    raw = folder.read_file(name, limit=limit)
    if hashlib.sha256(raw).hexdigest() != digest:
        raise IndexFormatError(f"{file}: {name} does not match its sha256 in the index; re-index the dataset")
    return raw


def _pieces(field: dict, folder: ByteSource, file: str, shard_bytes: list[int]) -> dict[str, np.ndarray]:
    """The piece columns, from the one deflated file (or, in an older index, three .npy columns)."""
    count = field["pieces"]
    if PIECES_NAME in field["hashes"]:
        raw = _read(folder, PIECES_NAME, 32 * count + 4096, field["hashes"][PIECES_NAME], file)
        try:
            return pieces_file.decode(raw, count, shard_bytes)
        except ValueError as e:
            raise IndexFormatError(f"{file}: {PIECES_NAME} is damaged ({e}); re-index the dataset") from None
    cols = {}
    for key, name in PIECE_FILES.items():
        raw = _read(folder, name, 16 * count + 4096, field["hashes"][name], file)
        try:
            cols[key] = np.load(io.BytesIO(raw), allow_pickle=False)
        except (ValueError, OSError) as e:
            raise IndexFormatError(f"{file}: {name} is not a .npy column ({e}); re-index the dataset") from None
        if cols[key].shape != (count,):
            raise IndexFormatError(f"{file}: {name} holds {cols[key].shape}, not {count} pieces")
    return cols


def frame_columns(data: dict, root: Path | str, source: ByteSource | None, file: Path | str) -> dict[str, np.ndarray]:
    """The per-frame columns of an index that keeps them in `REFERENCE_FRAMES` (``data`` its JSON, which
    `index.v2.check_meta` checked; ``source`` its folder's byte source, None for a local folder)."""
    field = check_reference(data["reference"], str(file))
    folder = LocalSource(Path(root)) if source is None else source
    raw = _read(folder, REFERENCE_FRAMES, 32 * data["frames"] + 4096, field["hashes"][REFERENCE_FRAMES], str(file))
    try:
        return frames_file.decode(raw, data["frames"])
    except ValueError as e:
        raise IndexFormatError(f"{file}: {REFERENCE_FRAMES} is damaged ({e}); re-index the dataset") from None


def _files(field: dict, folder: ByteSource, file: str) -> list[ref.FileInfo] | Files:
    """The source files: the JSON's list, then the image table's (checked: counts, sizes, names)."""
    images = field.get("images")
    if images is None:
        return field["files"]
    raw = _read(folder, IMAGES_NAME, 17 * images["count"] + images["names"] + 4096, field["hashes"][IMAGES_NAME],
                file)
    try:
        return Files(field["files"], ImageFiles.decode(raw, images["count"], images["names"]))
    except ValueError as e:
        raise IndexFormatError(f"{file}: {IMAGES_NAME} is damaged ({e}); re-index the dataset") from None


def _steps(meta: dict, file: str) -> int:
    """The index's frame rows (every step of every episode), as its checked JSON counts them."""
    steps = meta.get("frames")
    if type(steps) is not int or steps < 0:
        raise IndexFormatError(f"{file}: frames={str(steps)[:20]!r} should count the index's steps; re-index it")
    return steps


def default_root(root: Path | str, up: int | None) -> str | None:
    """The source root of an index written inside it: ``up`` folders above the index folder ``root``."""
    if up is None:
        return None
    if isinstance(root, str):
        parts = root.rstrip("/").split("/")
        return "/".join(parts[:-up]) if len(parts) - up > 3 else None  # never above the bucket
    parents = Path(root).resolve().parents
    return str(parents[up - 1]) if up <= len(parents) else None


def open_reference(meta: dict, root: Path | str, folder: ByteSource, file: str, source_root: str | os.PathLike | None,
                   options: Any = None) -> ref.ReferenceSource:
    """The `ReferenceSource` of a reference index (``meta`` its checked JSON, ``folder`` its own byte source)."""
    field = check_reference(meta["reference"], file)
    where = str(source_root) if source_root is not None else default_root(root, field.get("up"))
    if where is None:
        raise ValueError(f"{file} indexes a dataset's files in place, and lies outside it: pass its root, "
                         "EpisodeIndex.open(OUT, source_root=SRC) (a folder or an s3://, gs://, https:// root), or "
                         "open that index and pass it to the pipe")
    meta_shards = [(s["name"], s["bytes"]) for s in meta["shards"]]
    cols = _pieces(field, folder, file, [b for _, b in meta_shards])
    files = _files(field, folder, file)
    remote = is_url(where)
    base = where.rstrip("/") if remote else os.path.realpath(where)
    folders: dict[str, ByteSource] = {}

    def open_file(name: str) -> tuple[ByteSource, str]:
        folder_name, _, base_name = name.rpartition("/")
        if not remote:
            real = os.path.realpath(os.path.join(base, name))
            if os.path.commonpath([real, base]) != base:
                raise ShardIOError(f"{where}/{name} resolves outside the source root {where} (a link); refused")
        src = folders.get(folder_name)
        if src is None:
            at = f"{base}/{folder_name}" if folder_name else base
            src = folders[folder_name] = open_source(at, options=options) if remote else LocalSource(at)
        return src, base_name

    rows = None
    if field.get("rows") is not None:
        rows = (ROWS_NAME, field["rows"], _steps(meta, file))
        size = folder.size(ROWS_NAME)
        if size != ref.rows_bytes(rows[2], rows[1]):
            raise IndexFormatError(f"{file}: {ROWS_NAME} holds {size} bytes, not the {rows[2]} steps of {rows[1]} "
                                   f"bytes and their CRC32s the index says; re-index the dataset")
    literal, literal_source = LITERAL_NAME, None
    if LITERAL_BLOCKS in field["hashes"]:
        literal = LITERAL_BLOCKS
        literal_source = reference_blocks.BlockFile(folder, literal, field["literal"], IndexFormatError,
                                                    f"{file} is damaged; re-index the dataset")
    try:
        return ref.ReferenceSource(str(root), folder, meta_shards, cols, files,
                                   (literal, field["literal"]), open_file, lambda n: f"{where}/{n}",
                                   ShardIOError, STALE, rows, literal_source)
    except ValueError as e:
        raise IndexFormatError(f"{file}: the reference pieces are damaged ({e}); re-index the dataset") from None
