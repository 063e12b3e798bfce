"""One builder per pipe kind, of the public nodes: plan -> `ShardReader` -> `Decoder` -> `BatchStacker` -> `Gate`."""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from episodepipes.index import Episode, EpisodeIndex
from episodepipes.pipes._decode.slabs import Slabs
from episodepipes.pipes.batch import BatchStacker
from episodepipes.pipes.chosen import choose
from episodepipes.pipes.decode import Decoder
from episodepipes.pipes.frames import JPEG
from episodepipes.pipes.gate import Gate
from episodepipes.pipes.names import batch_keys, keyed_builder, window_keys
from episodepipes.pipes.options import DecodeOptions, ReadOptions
from episodepipes.pipes.order.window import Window, plan_windows, video_fields
from episodepipes.pipes.pipe import Pipe
from episodepipes.pipes.plan import Item, num_batches, per_rank, rank_items, shards_of, video_items
from episodepipes.pipes.read import ShardReader
from episodepipes.pipes.seconds import DEFAULT_TOLERANCE_S, seconds_windows
from episodepipes.pipes.select import Where, select
from episodepipes.pipes.stats import Stats
from episodepipes.pipes.transform import SampleTransform, Transform, sample_transform
from episodepipes.pipes.videoframes import VideoFrames, video_cameras

RESERVED = ("episode", "frame", "timestamp", "valid", "prompt")


# Arguments metric_pipe and video_pipe take alike, described once; `_shared_args` writes them into each docstring
# where a ``{name}`` line stands, so help() and docs/API.md show every argument of both in full.
_SHARED_ARGS = {
    "decode": """\
num_workers: decode workers (threads or processes), an int >= 1.
method: ``"thread"`` (``cv2.imdecode`` releases the GIL) or ``"process"`` (for graphs whose other
    stages hold the GIL); anything else is refused.
resize: ``(H, W)``, two ints >= 1, every camera is decoded to; None keeps the stored size, and then
    every episode's cameras must have the same size.
on_corrupt: ``"skip"`` (a frame that fails its crc32 or does not decode comes as zeros with
    ``valid=False``, counted in ``stats["frames_corrupt"]`` and logged) or ``"raise"``.
verify: check the sha256 of the shards the plan reads, once, before the first byte of the first
    (open) pass; a missing or changed shard raises there. Must be a bool.""",
    "windows": """\
history: ``{key: K}``, K >= 1 steps ending at the current one, per camera or array key, as in
    `train_pipe`: the value gains a step axis (the current step last) and ``<key>_pad`` (bool ``[K]``) is
    True where a step lies before the episode (it repeats the first step). None: no history. An unknown key
    is refused, listing the known ones.
horizon: ``{key: H}``, H >= 1 steps starting at the current one (the current step first), padded past
    the episode's end with its last step; a key in both windows has steps ``t-K+1 .. t+H-1``. None: no
    horizon. Windows do not change which frames are planned or ``len()``; each step they show is read
    once, and a camera frame several samples of a batch show is decoded once.""",
    "seconds_names": """\
delta_timestamps: LeRobot's ``{key: [offsets in seconds]}``, as in `train_pipe`: each key's offsets become
    steps at the episodes' fps by LeRobot's rule (within ``tolerance_s`` of a step, else refused), and must
    be consecutive and ascending (`episodepipes.pipes.seconds`); a key may be a LeRobot name. None: none.
tolerance_s: how far (seconds) an offset of ``delta_timestamps`` may lie from a step, > 0 (LeRobot's 1e-4).
names: ``"index"`` (batch keys are the index's tar-safe names, masks ``<key>_pad``) or ``"lerobot"`` (the
    source dataset's names, ``observation.images.top``, masks ``<name>_is_pad``, and ``task``;
    `episodepipes.pipes.names`).""",
    "where_transform": """\
where: ``where(attributes) -> bool``, keeping the episodes it is True for; None keeps all.
transform: ``transform(sample) -> sample`` on each decoded sample dict, in the decode workers, before
    collation, as in `train_pipe`: it must return a dict, and pickle with ``method="process"`` (checked
    when the pipe is built). ``episode``, ``frame``, ``timestamp``, ``valid`` and ``prompt`` are
    restored after it (padding and corrupt samples stay ``valid=False``). None: no transform.""",
}


def _shared_args(fn: Callable) -> Callable:
    """``fn`` with each ``{name}`` line of its docstring replaced by ``_SHARED_ARGS[name]``, at that line's indent."""
    if fn.__doc__:  # None under python -OO
        lines = []
        for line in inspect.cleandoc(fn.__doc__).splitlines():
            key = line.strip()
            if key.startswith("{") and key.endswith("}") and key[1:-1] in _SHARED_ARGS:
                pad = line[:len(line) - len(line.lstrip())]
                lines += [pad + x for x in _SHARED_ARGS[key[1:-1]].splitlines()]
            else:
                lines.append(line)
        fn.__doc__ = "\n".join(lines)
    return fn


def open_index(index: EpisodeIndex | str | os.PathLike) -> EpisodeIndex:
    return index if isinstance(index, EpisodeIndex) else EpisodeIndex.open(index)


def dist_rank_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Explicit values win; else torch.distributed's when initialised; else (0, 1)."""
    if rank is None or world_size is None:
        import torch.distributed as dist

        on = dist.is_available() and dist.is_initialized()
        rank = rank if rank is not None else (dist.get_rank() if on else 0)
        world_size = world_size if world_size is not None else (dist.get_world_size() if on else 1)
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank={rank}, world_size={world_size}: need 0 <= rank < world_size")
    return rank, world_size


def _dtype(name: str) -> str:
    """``np.dtype(name).str`` ("float32" and "<f4" alike give "<f4"); the name itself when numpy does not parse it."""
    try:
        return np.dtype(name).str
    except TypeError:
        return name


def stack_mismatch(a: Episode, b: Episode) -> str | None:
    """Why ``a`` and ``b`` cannot share a batch (a key present in one only, or another dtype or shape), else None."""
    for kind, ka, kb in (("camera", a.cameras, b.cameras), ("array", a.arrays, b.arrays)):
        for key in sorted(set(ka) ^ set(kb)):
            has, lacks = (a, b) if key in ka else (b, a)
            return f"{kind} {key!r} is in episode {has.id!r} but not in {lacks.id!r}"
    for key in sorted(a.arrays):
        sa, sb = a.arrays[key], b.arrays[key]
        if _dtype(sa.dtype) != _dtype(sb.dtype) or tuple(sa.shape) != tuple(sb.shape):
            return (f"array {key!r} is {_dtype(sa.dtype)} {list(sa.shape)} in episode {a.id!r} but "
                    f"{_dtype(sb.dtype)} {list(sb.shape)} in {b.id!r}")
    return None


def check_batchable(episodes: Sequence[Episode], resize: tuple[int, int] | None) -> None:
    """Refuse episodes whose cameras or arrays cannot be stacked into one batch, naming both, the key and the fix.

    Arrays must match in key set, dtype and shape: nothing is cast (a float64 episode beside float32 ones is
    refused, not silently converted); re-shard them alike, or pipe them separately.
    """
    if not episodes:
        return
    first = episodes[0]
    checked: set[tuple[int, int]] = set()
    for e in episodes:
        # a v2 index gives the episodes of one schema the same cameras and arrays dicts: check each schema once
        same = (id(e.cameras), id(e.arrays))
        if same in checked:
            continue
        checked.add(same)
        why = stack_mismatch(first, e)
        if why:
            raise ValueError(f"episodes {first.id!r} and {e.id!r} cannot share a batch: {why}; re-shard them with "
                             "the same keys, dtypes and shapes, or pipe them separately")
        shapes = {c: (cam.height, cam.width) for c, cam in e.cameras.items()}
        if resize is None and shapes != {c: (cam.height, cam.width) for c, cam in first.cameras.items()}:
            raise ValueError(f"episodes {first.id!r} and {e.id!r} have different camera sizes; pass resize=(H, W)")
    clash = sorted(set(RESERVED) & (set(first.cameras) | set(first.arrays)))
    if clash:
        raise ValueError(f"camera or array names {clash} clash with batch keys {RESERVED}; rename them when sharding")


def eval_windows(index: EpisodeIndex, episodes: Sequence[Episode], history: Mapping[str, int] | None,
                 horizon: Mapping[str, int] | None) -> dict[str, Window]:
    """``history``/``horizon`` of a metric or video pipe as `train_pipe` plans them (`plan_windows`); a camera
    stored as video reads its steps' GOPs from its video member (``<camera>.<codec>``), as train_pipe's packed
    reader does."""
    if not episodes:
        return {}
    windows = plan_windows(history, horizon, cameras=set(episodes[0].cameras), arrays=set(episodes[0].arrays))
    return video_fields(windows, video_cameras(index))


def graph_builder(index: EpisodeIndex, items: Sequence[Item], stats: Stats, *, batch_size: int,
                  decode: DecodeOptions, read: ReadOptions, transform: SampleTransform | None = None,
                  windows: dict[str, Window] | None = None) -> Callable[[], BatchStacker]:
    """A zero-argument builder of reader -> decoder -> stacker over ``items`` (what a `Gate` holds);
    ``transform`` runs per sample in the decode workers, and ``windows`` (`plan_windows`) are read and decoded,
    as in train_pipe (a camera frame several samples of a batch show is decoded once)."""
    verified: list[bool] = []
    slabs = Slabs(batch_size)  # batch buffers outlive a pass: the next pass reuses them (no page faults)
    video = video_cameras(index)
    # video and metric pipes read a GOP's frames in order; a camera window asks for earlier ones again (train's rule)
    frames = VideoFrames(video, tail=None if set(video) & set(windows or ()) else 1) if video else JPEG

    def build() -> BatchStacker:
        if read.verify and not verified:  # once, before the first byte of the first open pass
            index.verify(shards=shards_of(index, items))
            verified.append(True)
        reader = ShardReader(index, items, stats=stats, windows=windows)
        dec = Decoder(reader, index, decode, stats=stats, slab=slabs, frames=frames, transform=transform,
                      share_frames=bool(windows), slices=reader.send_slices)
        return BatchStacker(dec, batch_size=batch_size, stats=stats, rows=dec)

    return build


@_shared_args
def metric_pipe(index: EpisodeIndex | str | os.PathLike, *, split: str = "val", frames_per_episode: int,
                batch_size: int, rank: int | None = None, world_size: int | None = None, seed: int = 0,
                sampling: str = "even", num_workers: int = 2, method: str = "thread",
                resize: tuple[int, int] | None = None, on_corrupt: str = "skip", verify: bool = False,
                episodes: Sequence[str] | None = None, where: Where | None = None,
                transform: Transform | None = None, history: Mapping[str, int] | None = None,
                horizon: Mapping[str, int] | None = None,
                delta_timestamps: Mapping[str, Sequence[float]] | None = None,
                tolerance_s: float = DEFAULT_TOLERANCE_S, names: str = "index") -> Pipe:
    """K frames of every ``split`` episode, split so every rank yields the same number of batches.

    ``episodes=`` (ids, all in ``split``) and ``where=`` (a predicate over each episode's attributes, see
    `episodepipes.pipes.select.attributes`) narrow the episodes, resolved from the index alone.

    Frames are the centres of K equal slices of each episode (``sampling="even"``) or K drawn from a
    generator seeded by ``(seed, episode id)`` (``"random"``); an episode shorter than K gives all its
    frames. Each rank takes a contiguous block of the chosen frames, so its reads go forward through
    the shards, one seek per frame or run of adjacent frames.
    Padding samples repeat a real frame with ``valid=False``; the valid samples over all ranks are the
    chosen frames, each once. A corrupt frame (``on_corrupt="skip"``) also comes as ``valid=False``.

    Args:
        index: an open `EpisodeIndex`, or the shard folder (or its ``index.json``) to open.
        split: the split whose episodes are read; one with no episodes is refused, naming the splits there.
        frames_per_episode: K, the frames chosen per episode, an int >= 1.
        batch_size: samples per batch, an int >= 1; the last batch of a pass may be short.
        rank: this process's rank, ``0 <= rank < world_size``. None (with ``world_size``): taken from
            torch.distributed when it is initialised, else 0; a pipe whose rank was inferred checks it
            against the running process group at each ``iter()`` (a pipe built before the group started
            would give every rank rank 0's frames).
        world_size: the number of ranks the frames are split over, an int >= 1; None as for ``rank``.
        seed: seeds ``sampling="random"`` (with each episode's id, so a choice does not depend on the
            other episodes); unused by ``"even"``.
        sampling: ``"even"`` (centres of K equal slices, the same frames every run) or ``"random"``;
            anything else is refused.
        {decode}
        episodes: ids of the episodes to read, all in ``split``; None for every one.
        {where_transform}
        {windows}
        {seconds_names}
    """
    decode = DecodeOptions(num_workers=num_workers, method=method, resize=resize, on_corrupt=on_corrupt)
    read = ReadOptions(verify=verify)
    idx = open_index(index)
    inferred = rank is None or world_size is None
    rank, world_size = dist_rank_world(rank, world_size)
    eps = choose(idx, split, episodes=episodes, where=where)  # columns, not an Episode per episode
    check_batchable(eps.schemas(), resize)
    sw = seconds_windows(delta_timestamps, eps, tolerance_s=tolerance_s, history=history, horizon=horizon,
                         keys=window_keys(eps))
    windows = eval_windows(idx, eps, sw.history, sw.horizon)
    rename = batch_keys(names, idx, eps, windows)
    items, total = rank_items(eps.ids, eps.lengths, frames_per_episode, rank=rank, world_size=world_size,
                              sampling=sampling, seed=seed)  # this rank's share only
    stats = Stats()
    build = graph_builder(idx, items, stats, batch_size=batch_size, decode=decode, read=read,
                          transform=sample_transform(transform, method=method, pipe="metric_pipe"), windows=windows)
    length = num_batches(per_rank(total, world_size), batch_size)
    return Pipe(Gate(keyed_builder(build, rename, sw.trim), stats=stats), length=length, index=idx, stats=stats,
                gated=False, rank_world=(rank, world_size) if inferred else None)


@_shared_args
def video_pipe(index: EpisodeIndex | str | os.PathLike, *, episodes: Sequence[str] | None = None, batch_size: int,
               max_batches: int | None, gate: Callable[[], bool] | None = None, num_workers: int = 2,
               method: str = "thread", resize: tuple[int, int] | None = None, on_corrupt: str = "skip",
               verify: bool = False, where: Where | None = None, transform: Transform | None = None,
               history: Mapping[str, int] | None = None, horizon: Mapping[str, int] | None = None,
               delta_timestamps: Mapping[str, Sequence[float]] | None = None,
               tolerance_s: float = DEFAULT_TOLERANCE_S, names: str = "index") -> Pipe:
    """The pinned ``episodes``' frames in order, behind a `Gate` deciding each pass with ``gate()``.

    ``where=`` (a predicate over each episode's attributes, `episodepipes.pipes.select.attributes`) keeps
    some of ``episodes``, or picks them from every split (in index order) when ``episodes`` is None.

    Batches run across episode boundaries (group frames by ``batch["episode"]``); frames past
    ``max_batches * batch_size`` are never read. ``len()`` is the length of an open pass,
    ``min(max_batches, ceil(frames / batch_size))``, on every rank, open or closed. Frame tensors are
    views of batch buffers the pipe reuses once nothing references them (copy before keeping raw pointers).

    Args:
        index: an open `EpisodeIndex`, or the shard folder (or its ``index.json``) to open.
        episodes: ids of the episodes to render, in this order, from any split; None: those ``where`` picks.
        batch_size: frames per batch, an int >= 1.
        max_batches: the cap on batches per pass, a positive int (None is refused): under DDP the other
            ranks wait in their next collective while rank 0 renders, so an uncapped render could outlast
            the process-group timeout. Frames past the cap are never read.
        gate: a zero-argument predicate asked at the first ``next()`` of each pass; a false answer ends the
            pass there, without building the graph (no workers, no shard opened). None opens every pass; bind one later
            with ``pipe.gate.bind(fn)`` (e.g. ``lambda: trainer.is_global_zero``).
        {decode}
        {where_transform}
        {windows}
        {seconds_names}
    """
    if max_batches is None or isinstance(max_batches, bool) or not isinstance(max_batches, int) or max_batches < 1:
        raise ValueError(
            f"max_batches={max_batches!r}: a video pipe needs a positive int cap. Under DDP, rank 0 renders "
            "while the other ranks wait in the next collective; an uncapped render can outlast the process-group "
            "timeout and kill the run. Pick max_batches so one render pass takes well under that timeout.")
    decode = DecodeOptions(num_workers=num_workers, method=method, resize=resize, on_corrupt=on_corrupt)
    read = ReadOptions(verify=verify)
    idx = open_index(index)
    if episodes is None and where is None:
        raise ValueError("video_pipe needs episodes= (the ids to render) or where= (a predicate choosing them)")
    eps = select(idx, None, episodes=episodes, where=where, index_order=False)
    check_batchable(eps, resize)
    sw = seconds_windows(delta_timestamps, eps, tolerance_s=tolerance_s, history=history, horizon=horizon,
                         keys=window_keys(eps))
    windows = eval_windows(idx, eps, sw.history, sw.horizon)
    rename = batch_keys(names, idx, eps, windows)
    items = video_items(eps, batch_size=batch_size, max_batches=max_batches)
    stats = Stats()
    build = graph_builder(idx, items, stats, batch_size=batch_size, decode=decode, read=read,
                          transform=sample_transform(transform, method=method, pipe="video_pipe"), windows=windows)
    length = num_batches(len(items), batch_size, max_batches)
    return Pipe(Gate(keyed_builder(build, rename, sw.trim), gate, stats=stats), length=length, index=idx, stats=stats,
                gated=True)
