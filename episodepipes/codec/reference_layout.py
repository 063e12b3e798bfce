"""One episode's bytes in a ``--codec reference`` shard, laid out with numpy: exactly `codec.chunk`'s records and
chunks (what ``--codec copy`` writes), with the packets left in the source files.

The records after the first differ only in numbers (the sizes in their pack table, their backs), so their heads are
built as rows of one array; the first record (a copied stream's leading packets) and each chunk's tar header are
built one by one, as `codec.chunk` builds them. The result is the episode's piece table (literal runs, packets and
the arrays' rows, in shard order), its literal bytes, the fields the writer indexes, and its whole bytes (for the
CRC32s and the shard's sha256), which the tests check against `codec.chunk.layout` byte for byte.

Each record's rows (the last bytes of the record) are a piece of their own, of the *rows file* (`ROWS`), not
literal bytes: the rows file holds every step's rows back to back, so a step read only for its arrays (an action
horizon) reads its row there, without its record's packets (`reference.ReferenceSource.step_rows`).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from episodepipes.codec.chunk import EXT, cuts
from episodepipes.codec.pack import MAGIC
from episodepipes.format import tar_header

LITERAL = -1  # a piece's file number when its bytes are in the literal file
ROWS = -2  # ... in the rows file (``at``: the step's row number while laid out, `reference.Pieces` places it)


@dataclass
class CameraPackets:
    """One camera's packets for an episode: ``lead`` leading ones (frame 0's GOP), then one per frame."""

    file: int
    pos: np.ndarray
    size: np.ndarray
    data: memoryview
    lead: int


@dataclass
class EpisodeLayout:
    """An episode's pieces (start from the episode's first byte, file, and at: in ``literal`` or the file), its
    literal bytes, its whole bytes, and the writer's per-frame fields (the CRC32s on request)."""

    start: np.ndarray
    file: np.ndarray
    at: np.ndarray
    literal: bytes
    blob: bytes
    spans: list[int]
    heads: list[int]
    sizes: list[int]
    keys: list[int]
    records: list[int]  # each record's first byte in ``blob`` (after its chunk's head)
    rows: np.ndarray  # (steps, bytes): the arrays' rows, which the `ROWS` pieces point at

    def crcs(self) -> list[int]:
        """Each record's CRC32 (a pass over the bytes: a writer may run it beside its next episode's layout)."""
        bv = memoryview(self.blob)
        return [zlib.crc32(bv[s:s + z]) for s, z in zip(self.records, self.sizes)]


def _table(sizes: Sequence[int]) -> bytes:
    """`pack`'s head for blobs of these sizes."""
    ends = np.cumsum(np.asarray(sizes, np.int64)).tolist()
    return MAGIC + struct.pack(f"<I{len(ends)}I", len(ends), *ends)


def _later_heads(cams: Sequence[CameraPackets], backs: np.ndarray, widths: Sequence[int]) -> np.ndarray:
    """Rows of records 1.. (n-1 of them): their pack table and record head, each ``8 + 4 * blobs + 4 * cameras``."""
    n, ncam = backs.shape
    psize = np.stack([c.size[c.lead + 1:c.lead + n] for c in cams], axis=1)  # (n-1, cameras)
    blobs = np.hstack([np.full((n - 1, 1), 4 * ncam, np.int64), psize,
                       np.broadcast_to(np.asarray(widths, np.int64), (n - 1, len(widths)))])
    nb = blobs.shape[1]
    out = np.empty((n - 1, 8 + 4 * nb + 4 * ncam), np.uint8)
    out[:, :4] = np.frombuffer(MAGIC, np.uint8)
    out[:, 4:8] = np.frombuffer(struct.pack("<I", nb), np.uint8)
    out[:, 8:8 + 4 * nb] = np.cumsum(blobs, axis=1).astype("<u4", order="C").view(np.uint8)  # one camera: F order
    head = np.stack([backs[1:], np.ones_like(backs[1:])], axis=2).astype("<u2")  # per camera: back, one packet
    out[:, 8 + 4 * nb:] = head.reshape(n - 1, -1).view(np.uint8)
    return out


def layout(eid: bytes, cams: Sequence[CameraPackets], backs: np.ndarray, rows: np.ndarray,
           widths: Sequence[int]) -> EpisodeLayout:
    """Episode ``eid``'s bytes: ``cams`` in sorted order, ``backs[t, c]`` how many frames before t camera c's
    decode starts, ``rows`` (n, bytes) the arrays' raw rows side by side (sorted keys), ``widths`` each's bytes."""
    n, ncam = backs.shape
    lead0 = b"".join(struct.pack("<HH", int(backs[0, c]), cam.lead + 1) for c, cam in enumerate(cams))
    first = [(cam.file, p, z) for cam in cams for p, z in zip(cam.pos[:cam.lead + 1].tolist(),
                                                             cam.size[:cam.lead + 1].tolist())]
    head0 = _table([len(lead0), *(z for _, _, z in first), *widths]) + lead0
    later = _later_heads(cams, backs, widths) if n > 1 else np.zeros((0, 0), np.uint8)
    pk_file = np.concatenate([[f for f, _, _ in first], np.tile([c.file for c in cams], n - 1)]).astype(np.int64)
    pk_pos = np.concatenate([[p for _, p, _ in first],
                             *([np.stack([c.pos[c.lead + 1:c.lead + n] for c in cams], 1).ravel()] if n > 1 else [])])
    pk_size = np.concatenate([[z for _, _, z in first],
                              *([np.stack([c.size[c.lead + 1:c.lead + n] for c in cams], 1).ravel()] if n > 1
                                else [])]).astype(np.int64)
    per_rec = np.full(n, ncam, np.int64)
    per_rec[0] = len(first)
    rec_pk = np.add.reduceat(pk_size, np.concatenate([[0], np.cumsum(per_rec)[:-1]]))
    width = int(rows.shape[1])
    heads_len = np.full(n, later.shape[1] if n > 1 else 0, np.int64)
    heads_len[0] = len(head0)
    sizes = (heads_len + rec_pk + width).tolist()
    lit: list[bytes] = []
    lit_len = np.empty(n + 1, np.int64)  # the literal run before record k's packets (k = n: the episode's end)
    spans, heads = list(sizes), [0] * n
    chunks = cuts(backs, sizes)
    for a, b in chunks:
        member = 8 + 4 * (b - a) + sum(sizes[a:b])
        header = tar_header(b"%s/%06d.%s" % (eid, a, EXT.encode()), member)
        into = header + _table(sizes[a:b])
        pad = bytes(-member % 512)
        spans[a] += len(into)
        spans[b - 1] += len(pad)
        heads[a] = len(into)
        if a == 0:
            lit += [into, head0]
            lit_len[0] = len(into) + len(head0)
        else:
            lit += [into, later[a - 1].tobytes()]
            lit_len[a] += len(into) + later.shape[1]
        if b - a > 1:  # records a+1 .. b-1: the record's head (the previous record's rows are a rows piece)
            lit.append(later[a:b - 1].tobytes())
            lit_len[a + 1:b] = later.shape[1]
        lit.append(pad)
        lit_len[b] = len(pad)  # the next chunk's head adds to it
    literal = b"".join(lit)
    # per record: its literal run, its packets, its rows; then the episode's last literal run
    rec_of_pk = np.repeat(np.arange(n), per_rec)
    order = np.concatenate([np.arange(n + 1) * 3, rec_of_pk * 3 + 1, np.arange(n) * 3 + 2])
    size = np.concatenate([lit_len, pk_size, np.full(n, width, np.int64)])
    file = np.concatenate([np.full(n + 1, LITERAL, np.int64), pk_file, np.full(n, ROWS, np.int64)])
    at = np.concatenate([np.cumsum(lit_len) - lit_len, pk_pos, np.arange(n, dtype=np.int64) * width])
    sort = np.argsort(order, kind="stable")
    size, file, at = size[sort], file[sort], at[sort]
    start = np.cumsum(size) - size
    keep = size > 0
    start, file, at, size = start[keep], file[keep], at[keep], size[keep]
    rows = np.ascontiguousarray(rows, np.uint8)
    views = {c.file: c.data for c in cams}
    views[ROWS] = memoryview(rows.tobytes())
    lv = memoryview(literal)
    blob = b"".join([lv[a:a + z] if f == LITERAL else views[f][a:a + z]
                     for f, a, z in zip(file.tolist(), at.tolist(), size.tolist())])
    records = (np.cumsum(spans) - np.asarray(spans) + np.asarray(heads)).tolist()
    keys = (np.arange(n) - backs.max(axis=1, initial=0)).tolist()
    return EpisodeLayout(start, file, at, literal, blob, spans, heads, sizes, keys, records, rows)


__all__ = ["LITERAL", "ROWS", "CameraPackets", "EpisodeLayout", "layout"]
