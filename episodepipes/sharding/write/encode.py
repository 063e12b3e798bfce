"""Turn one episode into its encoded samples: JPEG per camera, .npy per array, json metadata.

With ``codec`` h264/av1/copy the episode is written in the packed layout (`episodepipes.codec.chunk`): per chunk
of whole GOPs one tar member holding every frame's record (its cameras' packets and its arrays' rows), so the tar
framing is paid per chunk instead of per frame and member. Copied packets (`EpisodeData.packets`) are stored as they
are, their leading packets included, so a frame decodes exactly as a decode of the whole source gives.

The tar bytes of a whole episode are laid out here, in the encoder process, as a list of parts
(headers, payloads, padding) plus each frame's size, so the single writing process only cuts
shards, hashes and writes large runs of bytes: it has no per-frame work left.
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

from episodepipes.codec import chunk
from episodepipes.codec.encode import CodecOptions, encode_frames
from episodepipes.codec.stream import Packets
from episodepipes.format import BLOCK, frame_json, npy_header, safe_episode_id, safe_field, tar_header, tar_headers
from episodepipes.sharding.episode import EpisodeData, EpisodeError


@dataclass(frozen=True, kw_only=True)
class EncodeOptions:
    """How `encode_episode` encodes frames: the part of `WriteOptions` an encoder process needs.

    Attributes:
        jpeg_quality: JPEG quality 1-100 of every camera frame.
        codec: "jpeg" (a JPEG per frame, a tar member each), or "h264"/"av1": each camera encoded in GOPs, in the
            packed layout; "copy": cameras with copied packets (`EpisodeData.packets`) store them, the others JPEG.
            The index records codec and GOP per video camera.
        gop: h264/av1: frames per keyframe (a frame decodes from its GOP's keyframe on).
        crf: h264/av1: quality, lower is better (`episodepipes.codec.CodecOptions`); None for the codec's default.
        fast_decode: h264 only: x264's fastdecode tune (`episodepipes.codec.CodecOptions.fast_decode`), cheaper
            to decode for a few more bytes.
        resize: ``(H, W)`` every frame is resized to before encoding, or None to keep the source size. The
            size before resizing is kept in the index (``source_height``/``source_width``), so pixel labels
            can be rescaled.
    """

    jpeg_quality: int = 90
    resize: tuple[int, int] | None = None  # (H, W)
    codec: str = "jpeg"
    gop: int = 2
    crf: int | None = None
    fast_decode: bool = False


@dataclass
class EncodedEpisode:
    meta: dict  # the index entry, without "segments"
    parts: list  # bytes-like pieces whose concatenation is every frame's tar members, in order
    sizes: list[int]  # tar bytes of each frame (in the packed layout its record, plus its chunk's framing)

    def data(self) -> bytes:
        return b"".join(self.parts)


def _jpeg(frame: np.ndarray, opts: EncodeOptions, where: str, *, bgr: bool = False) -> np.ndarray:
    if frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[2] != 3:
        raise EpisodeError(f"{where}: expected HxWx3 uint8 {'BGR' if bgr else 'RGB'}, got {frame.dtype} {frame.shape}")
    if opts.resize is not None:
        h, w = opts.resize
        frame = cv2.resize(frame, (w, h), interpolation=cv2.INTER_AREA)
    ok, buf = cv2.imencode(".jpg", frame if bgr else cv2.cvtColor(frame, cv2.COLOR_RGB2BGR),
                           [cv2.IMWRITE_JPEG_QUALITY, opts.jpeg_quality])
    if not ok:
        raise EpisodeError(f"{where}: JPEG encoding failed")
    return buf.reshape(-1)  # 1-D, so len() is its size; its buffer is joined as is, not copied to bytes


def _sized(frame: np.ndarray, opts: EncodeOptions, where: str, *, bgr: bool) -> np.ndarray:
    """An RGB frame at ``opts.resize``, for the video encoder (which takes one size per camera)."""
    if frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[2] != 3:
        raise EpisodeError(f"{where}: expected HxWx3 uint8 {'BGR' if bgr else 'RGB'}, got {frame.dtype} {frame.shape}")
    if opts.resize is not None:
        frame = cv2.resize(frame, (opts.resize[1], opts.resize[0]), interpolation=cv2.INTER_AREA)
    return cv2.cvtColor(frame, cv2.COLOR_BGR2RGB) if bgr else frame


def _packets(frames: list[np.ndarray], opts: EncodeOptions, where: str) -> Packets:
    """One camera's frames as one packet per frame, a keyframe every ``opts.gop`` frames exactly."""
    try:
        p = encode_frames(frames, CodecOptions(codec=opts.codec, gop=opts.gop, crf=opts.crf,
                                                  fast_decode=opts.fast_decode))
    except ValueError as e:
        raise EpisodeError(f"{where}: {e}") from None
    if p.extradata or len(p.data) != len(frames) or np.any(p.key != np.arange(len(frames)) // opts.gop * opts.gop):
        raise EpisodeError(f"{where}: the {opts.codec} encoder did not give one packet per frame in GOPs of {opts.gop}")
    return p


def _npy_rows(a: np.ndarray) -> list:
    """``npy_bytes(a[i, ...])`` for every step i: one shared header and slices of one buffer.

    ``a[i, ...]`` (a 0-d array for a 1-D ``a``) keeps the dtype exactly, byte order and string width
    included, so every member's header says what the index says; a numpy scalar ``a[i]`` would not.
    """
    a = a if a.flags.c_contiguous else a.copy(order="C")
    head, view = npy_header(a.dtype, a.shape[1:]), memoryview(a.reshape(-1).view(np.uint8))
    step = a.dtype.itemsize * int(np.prod(a.shape[1:], dtype=np.int64))
    return [head + view[i * step:(i + 1) * step] for i in range(len(a))]


def check_storable(dtype: np.dtype, where: str) -> None:
    """Refuse a dtype that .npy cannot hold exactly without pickle, or that the index cannot name."""
    if dtype.hasobject or dtype.kind in "OVT" or dtype.fields is not None or dtype.subdtype is not None:
        raise EpisodeError(f"{where} has dtype {dtype!r}, which a shard cannot store exactly (objects, "
                           "variable-width or structured values need pickle); convert it to numbers or "
                           "fixed-width strings (e.g. .astype('U16')) in the reader")


def encode_episode(ep: EpisodeData, opts: EncodeOptions, *, default_split: str = "train") -> EncodedEpisode:
    """Encode every frame of ``ep`` into its tar members, and its index entry.

    Checks what the index will promise: a camera's frames share one size (unless ``opts.resize``), every
    camera has the same frame count (not 0) and every array that many steps; arrays ``.npy`` cannot hold
    exactly without pickle are refused. Each refusal is an `EpisodeError` naming the episode, camera or array.

    Args:
        ep: the episode, as a reader returns it; its frames are consumed once, its packets stored as they are.
        opts: codec, JPEG quality and resize.
        default_split: the split recorded when ``ep.split`` is None.
    """
    eid = safe_episode_id(ep.id)
    if ep.channel_order not in ("rgb", "bgr"):
        raise EpisodeError(f"episode {ep.id!r}: channel_order={ep.channel_order!r}; the reader must say 'rgb' or 'bgr'")
    bgr = ep.channel_order == "bgr"
    copied = {safe_field(c): (c, p) for c, p in sorted(ep.packets.items())}
    if not ep.cameras and not copied:
        raise EpisodeError(f"episode {ep.id!r}: no cameras; every episode needs at least one")
    packed = opts.codec in ("h264", "av1") or bool(copied)  # as the index decides (writer.is_packed)
    video = opts.codec in ("h264", "av1")  # frames of the other cameras are JPEG (jpeg, or copy)
    cams = {safe_field(c): (c, it) for c, it in sorted(ep.cameras.items())}
    if set(cams) & set(copied):
        raise EpisodeError(f"episode {ep.id!r}: cameras {sorted(set(cams) & set(copied))} have both frames and "
                           "copied packets; the reader must give each camera one of them")
    per_cam: dict[str, list | Packets] = {}
    shapes: dict[str, tuple[int, int]] = {}
    sources: dict[str, tuple[int, int]] = {}  # frame 0's size before --resize, to rescale pixel labels
    for cam, (orig, frames) in cams.items():
        where = f"episode {ep.id!r} camera {orig!r} ({ep.files.get(orig, '?')})"
        out = []
        first: tuple[int, int] | None = None
        for i, frame in enumerate(frames):
            frame = np.asarray(frame)
            size = (int(frame.shape[0]), int(frame.shape[1])) if frame.ndim >= 2 else None
            if first is None:
                first = size
            elif size != first and opts.resize is None:  # the index records one (H, W) per camera
                raise EpisodeError(f"{where} frame {i} is {size}, frame 0 was {first}; a camera's frames must "
                                   "share one size: pass --resize HxW, or fix the source")
            if video:
                out.append(_sized(frame, opts, f"{where} frame {i}", bgr=bgr))
            else:
                out.append(_jpeg(frame, opts, f"{where} frame {i}", bgr=bgr))
        per_cam[cam] = _packets(out, opts, where) if video and out else out
        if first is not None:
            shapes[cam], sources[cam] = opts.resize or first, first
    for cam, (orig, p) in copied.items():
        if opts.resize is not None and tuple(opts.resize) != (p.height, p.width):
            raise EpisodeError(f"episode {ep.id!r} camera {orig!r}: its packets are copied at {p.height}x{p.width}, "
                               f"which --resize {opts.resize[0]}x{opts.resize[1]} cannot change; drop --resize "
                               "or use --codec av1")
        per_cam[cam] = p
        shapes[cam] = sources[cam] = (p.height, p.width)
    lengths = {c: len(v) for c, v in sorted(per_cam.items())}
    n = next(iter(lengths.values()))
    if len(set(lengths.values())) != 1:
        raise EpisodeError(f"episode {ep.id!r}: cameras have different frame counts {lengths}; trim them to match")
    if n == 0:
        raise EpisodeError(f"episode {ep.id!r}: empty episode (0 frames); remove it or pass --skip-bad")
    arrays = {safe_field(k): (k, np.asarray(v)) for k, v in sorted(ep.arrays.items())}
    for orig, a in arrays.values():
        check_storable(a.dtype, f"episode {ep.id!r} array {orig!r}")
        if a.ndim == 0 or a.shape[0] != n:
            raise EpisodeError(
                f"episode {ep.id!r}: array {orig!r} has {a.shape[0] if a.ndim else 0} steps but the cameras have "
                f"{n} frames; arrays' first dimension must equal the frame count"
            )
    fps = float(ep.fps)
    if packed:
        parts, sizes = _packed(eid.encode(), n, per_cam, arrays)
    else:
        # member suffix -> payload per frame; sorting suffixes sorts the member names, which share the key
        fields = {f".{cam}.jpg": v for cam, v in per_cam.items()}
        fields.update({f".{k}.npy": _npy_rows(a) for k, (_, a) in arrays.items()})
        fields[".json"] = [frame_json(eid, i, fps) for i in range(n)]
        parts, sizes = _layout(eid.encode(), n, [(s.encode(), fields[s]) for s in sorted(fields)])
    origs = {c: o for c, (o, _) in [*cams.items(), *copied.items()]}
    meta = {
        "id": eid,
        "split": ep.split or default_split,
        "length": n,
        "fps": fps,
        "prompt": ep.prompt,
        "cameras": {c: {"height": shapes[c][0], "width": shapes[c][1], "source": ep.sources.get(o, o),
                        "source_height": sources[c][0], "source_width": sources[c][1],
                        **_codec_meta(per_cam[c], opts.gop if c in cams else None)}
                    for c, o in sorted(origs.items())},
        "arrays": {k: {"dtype": a.dtype.str,
                       "shape": list(a.shape[1:]), "source": ep.sources.get(o, o)}
                   for k, (o, a) in arrays.items()},
        **ep.extra,  # the reader's further metadata (meta.json keys, zarr attrs): episode attributes in the index
    }
    return EncodedEpisode(meta, parts, sizes)


def _codec_meta(p: list | Packets, gop: int | None) -> dict:
    """A video camera's index fields: codec, GOP (``gop`` as encoded, or the most packets a copied frame's decode
    needs) and extradata."""
    if not isinstance(p, Packets):
        return {}
    extra = {"extradata": p.extradata.hex()} if p.extradata else {}
    return {"codec": p.codec, "gop": gop or max(p.max_gop(), 1), **extra}


def _packed(eid: bytes, n: int, per_cam: dict[str, list | Packets], arrays: dict) -> tuple[list, list[int]]:
    """(parts, frame sizes) of the packed layout: a record per frame (`chunk.record`), chunks of whole GOPs."""
    names = sorted(per_cam)
    backs = np.zeros((n, len(names)), np.int64)
    blobs: list[list[list[bytes]]] = []  # per camera, per frame: its packets
    for c, name in enumerate(names):
        p = per_cam[name]
        if isinstance(p, Packets):
            key = np.maximum(np.asarray(p.key[p.lead:], np.int64) - p.lead, 0)  # leading packets go with frame 0
            backs[:, c] = np.arange(n) - key
            blobs.append([list(p.data[:p.lead + 1]), *([x] for x in p.data[p.lead + 1:])])
        else:
            blobs.append([[bytes(x)] for x in p])
    if (backs >= chunk.MAX_BACK).any():
        raise EpisodeError(f"episode {eid.decode()!r}: a frame's decode starts {int(backs.max())} frames before it, "
                           f"more than {chunk.MAX_BACK - 1}; use shorter GOPs (--codec av1 --gop N)")
    rows = [_raw_rows(a) for _, a in arrays.values()]
    back_rows = backs.tolist()
    records = [chunk.record(back_rows[t], [b[t] for b in blobs], [r[t] for r in rows]) for t in range(n)]
    return chunk.layout(eid, records, backs)


def _raw_rows(a: np.ndarray) -> list:
    """Each step's row of ``a`` as raw C-order bytes (slices of one buffer): the packed layout's array rows."""
    a = a if a.flags.c_contiguous else a.copy(order="C")
    view = memoryview(a.reshape(-1).view(np.uint8)) if a.size else memoryview(b"")
    step = a.dtype.itemsize * int(np.prod(a.shape[1:], dtype=np.int64))
    return [view[i * step:(i + 1) * step] for i in range(len(a))]


_ZEROS = bytes(BLOCK)


def _layout(eid: bytes, n: int, columns: list[tuple[bytes, list]]) -> tuple[list, list[int]]:
    """(parts, frame sizes) of frames 0..n-1 whose members are ``eid/<frame><suffix>`` per column.

    Each column's headers come from one `tar_headers` call; the per-member Python that is left only
    slices and interleaves. Names over tar's 100 bytes, or frame numbers past 6 digits, go one by one.
    """
    keys = b"".join(b"%s/%06d" % (eid, i) for i in range(n))
    width, m = len(keys) // n, len(columns)
    if n > 10**6 or width + max(len(s) for s, _ in columns) > 100:
        return _layout_slow(eid, n, columns)
    names = np.zeros((n, m, 100), np.uint8)  # tar pads names with NULs to 100 bytes
    names[:, :, :width] = np.frombuffer(keys, np.uint8).reshape(n, 1, width)
    for c, (suffix, _) in enumerate(columns):
        names[:, c, width:width + len(suffix)] = np.frombuffer(suffix, np.uint8)
    size = np.array([list(map(len, payload)) for _, payload in columns], np.int64).T.reshape(-1)  # frame-major
    pad = -size % BLOCK
    heads = memoryview(tar_headers(names.reshape(n * m, 100), size).reshape(-1))
    members = zip([heads[k:k + BLOCK] for k in range(0, n * m * BLOCK, BLOCK)],
                  [x for row in zip(*(payload for _, payload in columns)) for x in row],
                  [_ZEROS[:p] for p in pad.tolist()])
    return [x for member in members for x in member], (BLOCK + size + pad).reshape(n, m).sum(axis=1).tolist()


def _layout_slow(eid: bytes, n: int, columns: list[tuple[bytes, list]]) -> tuple[list, list[int]]:
    parts: list = []
    sizes: list[int] = []
    for i in range(n):
        key, total = b"%s/%06d" % (eid, i), 0
        for suffix, payload in columns:
            data = payload[i]
            size = len(data)
            head, pad = tar_header(key + suffix, size), (-size) % BLOCK
            parts += (head, data, _ZEROS[:pad])
            total += len(head) + size + pad
        sizes.append(total)
    return parts, sizes
