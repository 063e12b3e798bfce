"""Image cameras indexed in place (``--codec reference``): each frame points at its image's bytes where they lie.

A LeRobot image feature is a parquet column of ``{bytes, path}`` cells. Bytes embedded in the parquet are pointed at
inside the parquet file (`codec.parquet_pages`: UNCOMPRESSED or SNAPPY pages, PLAIN or dictionary-encoded; anything
else is refused with the fix, ``--codec copy``), each frame's pieces checked against pyarrow's own read of the cell;
a cell with no bytes and a ``path`` points at that image file, which must lie inside the dataset root. A raw
episode's image folder points at its files. Every image is checked by its header before it is indexed (PNG or JPEG,
its sides and pixels, frame 0's size: `sharding.formats.imagehead`), and frame 0 of each camera is decoded once, so
an image OpenCV turns (EXIF) is refused rather than indexed at a size the readers would not decode it to.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import cv2
import numpy as np

from episodepipes.codec import reference as ref
from episodepipes.codec.image_pieces import ImageFiles, ImageFrames
from episodepipes.codec.parquet_pages import Chunk, ParquetPagesError, Values, read_values
from episodepipes.sharding.episode import EpisodeError
from episodepipes.sharding.formats import lerobot_meta as meta
from episodepipes.sharding.formats.imagehead import MAX_IMAGE_BYTES, check_header, read_image

FIX = "use --codec copy for this dataset (or rewrite its parquet files UNCOMPRESSED or SNAPPY, without dictionaries)"


def frames_of(pieces: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]], views: Callable[[int], memoryview],
              where: Callable[[int], str]) -> ImageFrames:
    """An image camera's frames from each frame's pieces (file numbers, at, size), checked by their headers and
    frame 0 by its decode. ``views(file)`` gives a file's bytes, ``where(t)`` names frame t in messages."""
    first, head, blobs = [0], None, []
    for t, (f, a, z) in enumerate(pieces):
        if int(z.sum()) > MAX_IMAGE_BYTES:
            raise EpisodeError(f"{where(t)} holds {int(z.sum())} bytes, more than the {MAX_IMAGE_BYTES} a frame "
                               "image may; replace it")
        data = b"".join(views(int(k))[int(x):int(x) + int(n)] for k, x, n in zip(f, a, z))
        size = check_header(data, where(t), head, t)
        if head is None:
            head = size
            img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
            if img is None or img.shape[:2] != size:
                raise EpisodeError(f"{where(t)} decodes to {None if img is None else img.shape[:2]}, its header "
                                   f"says {size} (damaged, or turned by its EXIF); {FIX}")
        blobs.append(data)
        first.append(first[-1] + len(f))
    file = np.concatenate([p[0] for p in pieces]).astype(np.int64)
    at = np.concatenate([p[1] for p in pieces]).astype(np.int64)
    size = np.concatenate([p[2] for p in pieces]).astype(np.int64)
    lens = np.asarray([len(b) for b in blobs], np.int64)
    assert head is not None
    return ImageFrames(np.asarray(first, np.int64), file, at, size, b"".join(blobs), np.cumsum(lens) - lens, *head)


def image_file(images: ImageFiles, real_root: Path, path: Path, where: str) -> tuple[int, bytes]:
    """(number, bytes) of the image file ``path`` (resolved, inside the root), added to ``images``."""
    rel = path.relative_to(real_root).as_posix()
    try:
        ref.check_file(rel)
    except ValueError as e:
        raise EpisodeError(f"{where}: {e}; rename it") from None
    data = read_image(path, f"{where}: image {rel}")
    return images.add(rel, data), data


def raw_camera(images: ImageFiles, real_root: Path, files: Sequence[Path], where: str) -> ImageFrames:
    """A raw episode's image folder (its files, resolved and inside the root, in frame order)."""
    got = [image_file(images, real_root, Path(p).resolve(), where) for p in files]
    datas = {k: memoryview(d) for k, d in got}
    pieces = [(np.asarray([k]), np.zeros(1, np.int64), np.asarray([len(d)])) for k, d in got]
    return frames_of(pieces, datas.__getitem__, lambda t: f"{where}: image {files[t]}")


class ParquetImages:
    """The image features of one LeRobot data file: each row's cell, as pieces of the file or an image file."""

    def __init__(self, number: int, data: memoryview, path: Path, keys: Sequence[str], where: str) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.number, self.data, self.where = number, data, where
        try:
            pf = pq.ParquetFile(pa.BufferReader(pa.py_buffer(data)))
            table = pf.read(columns=[*keys, "episode_index", "frame_index"])
        except (pa.ArrowException, OSError) as e:
            raise EpisodeError(f"{where}: cannot read the parquet file ({e}); re-download it") from None
        self.order = np.lexsort((table.column("frame_index").to_numpy(), table.column("episode_index").to_numpy()))
        self.cells: dict[str, tuple[list, list, Values | None]] = {}
        for key in keys:
            col = table.column(key).combine_chunks()
            if pa.types.is_struct(col.type) and {"bytes", "path"} <= {col.type.field(i).name
                                                                     for i in range(col.type.num_fields)}:
                blobs, paths, leaf = col.field("bytes").to_pylist(), col.field("path").to_pylist(), f"{key}.bytes"
                nulls = col.is_null().to_pylist()
                blobs = [None if n else b for b, n in zip(blobs, nulls)]
                paths = [None if n else p for p, n in zip(paths, nulls)]
            elif pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type):
                blobs, paths, leaf = col.to_pylist(), [None] * len(col), key
            else:
                raise EpisodeError(f"{where} image feature {key!r}: the column holds {col.type}, not {{bytes, path}} "
                                   "cells; re-export the dataset with images embedded")
            values = self._values(pf, leaf, key) if any(b is not None for b in blobs) else None
            self.cells[key] = (blobs, paths, values)

    def _values(self, pf, leaf: str, key: str) -> Values:  # noqa: ANN001 (pyarrow.parquet.ParquetFile)
        md = pf.metadata
        cols = [j for j in range(md.num_columns) if md.schema.column(j).path == leaf]
        fw = f"{self.where} image feature {key!r}"
        if len(cols) != 1 or md.schema.column(cols[0]).max_repetition_level:
            raise EpisodeError(f"{fw}: no single column {leaf!r} of byte strings; {FIX}")
        j, max_def = cols[0], md.schema.column(cols[0]).max_definition_level
        chunks = []
        for g in range(md.num_row_groups):
            c = md.row_group(g).column(j)
            start = c.dictionary_page_offset if c.has_dictionary_page else c.data_page_offset
            chunks.append(Chunk(int(start), int(c.total_compressed_size), str(c.compression), int(c.num_values),
                                int(max_def)))
        try:
            values = read_values(self.data, chunks, fw)
        except ParquetPagesError as e:
            raise EpisodeError(f"{e}; {FIX}") from None
        if len(values) != md.num_rows:
            raise EpisodeError(f"{fw}: its pages hold {len(values)} rows, the file {md.num_rows}; {FIX}")
        return values

    def camera(self, key: str, lo: int, hi: int, images: ImageFiles, real_root: Path, where: str) -> ImageFrames:
        """Rows ``lo:hi`` (of the file's rows sorted by episode and frame) of image feature ``key``."""
        blobs, paths, values = self.cells[key]
        pieces, views = [], {self.number: self.data}
        rows = self.order[lo:hi].tolist()
        for t, r in enumerate(rows):
            rw = f"{where} row {t}"
            if blobs[r] is not None:
                assert values is not None
                if values.is_null(r) or values.nbytes(r) != len(blobs[r]):
                    raise EpisodeError(f"{rw}: the parquet pages do not hold its cell's bytes; {FIX}")
                at, size = values.pieces(r)
                pieces.append((np.full(len(at), self.number), at, size))
            elif paths[r]:
                real = meta.regular_file(meta.inside(real_root, paths[r], f"{rw}: image path", EpisodeError),
                                         f"{rw}: image path", EpisodeError)
                k, data = image_file(images, real_root, real, rw)
                views[k] = memoryview(data)
                pieces.append((np.asarray([k]), np.zeros(1, np.int64), np.asarray([len(data)])))
            else:
                raise EpisodeError(f"{rw}: no image bytes and no path; re-export the dataset with images embedded")
        frames = frames_of(pieces, views.__getitem__, lambda t: f"{where} row {t}: image")
        for t, r in enumerate(rows):  # the pieces' bytes are the cell's, as pyarrow reads it
            if blobs[r] is not None and frames.data[frames.offsets[t]:frames.offsets[t] + len(blobs[r])] != blobs[r]:
                raise EpisodeError(f"{where} row {t}: the bytes found in the parquet pages are not the cell's; {FIX}")
        return frames


__all__ = ["FIX", "ParquetImages", "frames_of", "image_file", "raw_camera"]
