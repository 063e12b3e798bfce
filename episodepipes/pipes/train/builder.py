"""`train_pipe`, the builder of the training graph: `TrainReader` (or the packed or mixture reader) -> `Decoder`
-> `BatchStacker`. It sits above the reader it builds (`reader`), the mixture (`mix`) and the packed reads (`packed`),
so none of them imports it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence, Set
from typing import Any

import numpy as np

from episodepipes.index import EpisodeIndex
from episodepipes.pipes.batch import BatchStacker
from episodepipes.pipes.builders import check_batchable, dist_rank_world, open_index
from episodepipes.pipes.chosen import choose
from episodepipes.pipes.decode import CHUNK, Decoder
from episodepipes.pipes.names import batch_keys, check_names, keyed, window_keys
from episodepipes.pipes.options import DecodeOptions
from episodepipes.pipes.order import block_order as bo
from episodepipes.pipes.order.window import plan_windows
from episodepipes.pipes.seconds import DEFAULT_TOLERANCE_S, seconds_windows
from episodepipes.pipes.select import Where
from episodepipes.pipes.stats import Stats
from episodepipes.pipes.train import packed as train_packed
from episodepipes.pipes.train.mix import mixture_pipe
from episodepipes.pipes.train.reader import SHUFFLES
from episodepipes.pipes.train.state import TrainPipe
from episodepipes.pipes.transform import sample_transform

log = logging.getLogger(__name__)


def train_pipe(index: EpisodeIndex | str | os.PathLike | Mapping[str, Any], *, split: str = "train",
               batch_size: int, seed: int,
               history: Mapping[str, int] | None = None, horizon: Mapping[str, int] | None = None,
               rank: int | None = None, world_size: int | None = None, num_workers: int = 2, method: str = "thread",
               transform: Callable[[dict[str, Any]], dict[str, Any]] | None = None, epochs: int | None = 1,
               resize: tuple[int, int] | None = None, on_corrupt: str = "skip", on_resize: str = "refuse",
               episodes: Sequence[str] | None = None, where: Where | None = None,
               stop: str | None = None, shuffle: str = "full", block_frames: int | None = None,
               window_blocks: int | None = None, delta_timestamps: Mapping[str, Sequence[float]] | None = None,
               tolerance_s: float = DEFAULT_TOLERANCE_S, names: str = "index") -> TrainPipe:
    """Shuffled frames of ``split``: ``epochs`` epochs per ``iter()``, the same whole number of batches per rank.

    Order: epoch ``e`` is a keyed permutation of every frame (`permute.IndexShuffle`, from ``seed`` and
    ``e``, computed per batch, never stored); rank ``r`` takes every ``world_size``-th entry from ``r``,
    trimmed to ``len(pipe) // epochs`` full batches (drop-last: at most ``world_size * batch_size - 1``
    frames sit out an epoch, different ones each epoch). Each ``iter()`` continues with the next epochs;
    ``epochs=None`` is one endless pass.

    Block order (``shuffle="block"``, for object stores): the frames, in index order, are cut into blocks of
    ``block_frames`` consecutive frames of one shard (contiguous bytes); the blocks are permuted, keyed by
    ``seed`` and the epoch, and each run of ``window_blocks`` consecutive blocks (a window) has its frames
    shuffled among themselves (`block_order`). It is still a permutation of every frame, a function of
    ``(seed, epoch)`` and the shard layout, so the deal over ranks, drop-last, resume and elastic resume are the
    full shuffle's. A remote root then reads each block with one ranged GET, a window ahead, instead of one GET
    per frame, and keeps this rank's frames of at most ``depth + 1`` windows in memory (``depth`` =
    ``max(1, ceil(4 * batch_size / (block_frames * window_blocks)))``); with ``cache_whole`` the shards of
    the next window download while this one decodes. The price is the mix: a batch holds frames of about
    ``window_blocks`` blocks (a few episodes each), not of the whole dataset; raise ``window_blocks`` for
    more. Every rank draws from the same windows, so each rank fetches the whole of every block it touches:
    with ``world_size`` ranks each one transfers about ``world_size`` times its own frames' bytes (the whole
    dataset per epoch). Ranks of one machine that share ``RemoteOptions(cache_dir=...)`` fetch each block once
    between them: one claims it, the others wait for its cache entry (`remote.cache.RangeCache`).
    Local shards are read a frame per call (a file cut short under a pass is an error naming it), in the same order.

    Windows (see `episodepipes.pipes.order.window`): ``history={"state": K}`` gives steps ``t-K+1..t`` (the
    current step last), ``horizon={"action": H}`` gives ``t..t+H-1`` (the current step first), both
    padded at episode edges with the nearest real step and marked in ``<key>_pad``. Only the returned
    steps' members are read and decoded.

    ``episodes=`` (ids, all in ``split``) and ``where=`` (a predicate over each episode's attributes: split,
    length, fps, prompt, cameras, arrays and the extra ``meta.json`` keys, see
    `episodepipes.pipes.select.attributes`) narrow the episodes, resolved from the index alone.

    Every episode of the split must have the same cameras, and arrays of the same keys, dtypes and shapes:
    a mismatch is refused when the pipe is built, naming both episodes and the key (nothing is cast).
    Frames read whole (each sample's current step, and the steps of camera windows) are checked against
    the index's crc32; a mismatch makes the sample corrupt, as a JPEG that does not decode (``on_corrupt``).

    ``transform(sample) -> sample`` runs per sample in the decode workers, before collation (so it must
    pickle for ``method="process"``); ``episode``, ``frame``, ``timestamp``, ``valid`` and ``prompt``
    are restored after it.

    State: ``state_dict()`` holds a cursor (epoch, this rank's ``pos``, and ``consumed``, the samples taken
    globally in the epoch) and what it depends on (seed, world size, batch size, their product the global
    batch, frame count and plan fingerprint, windows); see `TrainReader`. ``load_state_dict`` resumes it
    exactly, in any step, in a pipe of the same ``seed``, windows and episodes, and refuses others by name.
    The pipe a state is loaded into decides where the pass ends: its own ``epochs`` after the saved pass's first
    epoch (a run saved at ``epochs=2`` runs on to the end of 5 in a pipe of ``epochs=5``; what it yields is
    ``len()`` minus the batches already done), and a position past that end, or a field of the wrong type or
    out of range, is refused naming it.
    Elastic rule: the global stream depends on ``world_size * batch_size`` only, so a state saved at one
    world size resumes at another with the same product (any ``batch_size``), from a batch boundary, with no
    sample repeated or skipped against an uninterrupted run at the new size; any rank's state will do (every
    rank is at the same global position). Another global batch is refused, saying what differs, unless
    ``on_resize`` is ``"next_step"`` (exact where the new global batch divides ``consumed``, else skip to its
    next step) or ``"next_epoch"`` (start the next epoch); a skip is logged as a warning.

    Mixtures: ``index`` may be ``{name: Source(root, weight, keys=...)}`` (`train_mix.Source`; the one form,
    a tuple or a list of sources is refused). Global step ``s`` is the block ``[s*G, (s+1)*G)`` of the
    sources' deterministic interleave (`mixture.Mixture`), so every step, and every run of steps, holds each
    source's share within a small constant (within one sample for two sources); a step's samples are dealt to
    the ranks in a keyed order, and each source's frames come in their own keyed order per epoch.
    ``stop="cycle"`` (the default) ends an epoch when every source has given each of its frames (a smaller
    source starts a new order meanwhile); ``"first_exhausted"`` ends it just before any source would repeat.
    ``keys=`` renames and selects each source's cameras and arrays so batches stack; a mismatch that remains
    (a missing key, another dtype, shape or camera size) is refused when the pipe is built, naming both
    sources, episodes and the key. ``history``/``horizon`` and ``transform`` use the batch keys; the
    transform sees ``sample["source"]`` (so `normalize.PerSource` normalizes each source by its own
    statistics), and each batch has ``batch["source"]``, the source of each sample. ``episodes``/``where`` go
    per source (`Source`), ``split`` is every source's unless its `Source` says otherwise. The state adds the
    sources, weights and stop rule, and a state of another mixture is refused naming what differs.

    Args:
        index: an open `EpisodeIndex`, or the shard folder (or its ``index.json``) to open; or a mixture,
            ``{name: Source(...)}`` (names without ``:``), as above.
        split: the split whose frames are shuffled; one with no episodes is refused, naming the splits there.
        batch_size: samples per batch, an int >= 1; every batch is full (drop-last), and a split with too
            few frames for one full batch on every rank is refused.
        seed: a non-negative int fixing every epoch's order (required: a resumed run must use the same).
        history: ``{key: K}``, K >= 1 steps ending at the current one, per camera or array key; None: none.
            An unknown key is refused, listing the known ones.
        horizon: ``{key: H}``, H >= 1 steps starting at the current one, per camera or array key; None: none.
        rank: this process's rank, ``0 <= rank < world_size``. None (with ``world_size``): taken from
            torch.distributed when it is initialised, else 0; a pipe whose rank was inferred checks it
            against the running process group at each ``iter()`` (a pipe built before the group started
            would give every rank the same batches).
        world_size: the number of ranks the frames are split over, an int >= 1; None as for ``rank``.
        num_workers: decode workers (threads or processes), an int >= 1.
        method: ``"thread"`` (``cv2.imdecode`` releases the GIL) or ``"process"`` (for graphs whose other
            stages hold the GIL); anything else is refused.
        transform: ``transform(sample) -> sample`` on each decoded sample dict, in the decode workers, before
            collation; with ``method="process"`` it must pickle (checked when the pipe is built). The
            ``episode``, ``frame``, ``timestamp``, ``valid`` and ``prompt`` entries are restored after it.
            None: no transform.
        epochs: epochs per ``iter()``, a positive int, and ``len()`` is ``epochs`` times the batches per
            epoch; None is one endless pass with no ``len()`` (bound training by steps).
        resize: ``(H, W)``, two ints >= 1, every camera is decoded to; None keeps the stored size, and then
            every episode's cameras must have the same size.
        on_corrupt: ``"skip"`` (a sample with a frame that fails its crc32 or does not decode comes as zeros
            with ``valid=False``, counted in ``stats["frames_corrupt"]`` and logged) or ``"raise"``.
        episodes: ids of the episodes to read, all in ``split``; None for every one.
        where: ``where(attributes) -> bool``, keeping the episodes it is True for; None keeps all.
        on_resize: what ``load_state_dict`` does with a state of another global batch: ``"refuse"`` (the
            default), ``"next_step"`` or ``"next_epoch"``, as above.
        stop: a mixture's stop rule, ``"cycle"`` (None: the default) or ``"first_exhausted"``, as above; a
            pipe of one source takes None only.
        shuffle: ``"full"`` (the default: every frame anywhere in the epoch), ``"block"`` (the block order,
            as above) or ``"rank_block"`` (the rank-sharded block order, `order.rank_blocks`: the epoch's permuted
            blocks are cut into one contiguous share per rank, each shuffled in windows of ``window_blocks``
            blocks, so on an object store each rank fetches about the bytes it uses, in one request per block, at
            any world size; ranks stay even (drop-last); a state resumes exactly at the same sizes, and at
            others finishes its epoch on the saved shares before dealing new ones: exactly at the same global
            batch, and at another as ``on_resize`` says, as the block order does); a mixture takes ``"full"`` only.
        block_frames: with ``shuffle="block"`` or ``"rank_block"``, the frames per block, an int >= 1 (None: 64;
            a block also ends at a shard's end). Larger blocks mean fewer, bigger GETs and less mix.
        window_blocks: with ``shuffle="block"`` or ``"rank_block"``, the blocks whose frames are shuffled
            together, an int >= 1 (None: 8). More mix, and more memory (a window's frames are held until it is
            consumed).
        delta_timestamps: windows in seconds, LeRobot's ``{key: [offsets in seconds]}`` (``[-0.1, 0.0]`` at 10
            fps is ``history={key: 2}``), converted at the episodes' fps by LeRobot's rule: an offset must lie
            within ``tolerance_s`` of a step, and a key's steps must be consecutive and ascending, else it is
            refused by name (a run short of the current step reads it too and drops it from the batch;
            `episodepipes.pipes.seconds`). A key may be a LeRobot name; a key also in ``history``/``horizon`` is
            refused. None: none. A mixture takes windows in steps only.
        tolerance_s: how far (seconds) an offset of ``delta_timestamps`` may lie from a step, > 0 (LeRobot's
            default, 1e-4).
        names: ``"index"`` (the default: batch keys are the index's tar-safe names, masks ``<key>_pad``) or
            ``"lerobot"``: the source dataset's names (``observation.images.top``), masks ``<name>_is_pad`` and
            ``task`` beside ``prompt``, as a LeRobot policy reads them (`episodepipes.pipes.names`); the state is
            the same either way. A mixture names its keys with ``keys=``.
    """
    options = DecodeOptions(num_workers=num_workers, method=method, resize=resize, on_corrupt=on_corrupt)
    if isinstance(index, Sequence | Set) and not isinstance(index, str | bytes):
        raise TypeError(f"train_pipe got a {type(index).__name__} of sources; a mixture is a dict "
                        "{name: Source(root, weight)} (from episodepipes.pipes import Source)")
    mixture = isinstance(index, Mapping)
    if not mixture and stop is not None:
        raise ValueError(f"{stop=} is a mixture's stop rule; train_pipe of one source takes stop=None")
    if mixture and (episodes is not None or where is not None):
        raise ValueError("episodes= and where= choose one source's episodes; for a mixture pass them per source: "
                         "Source(root, weight, episodes=..., where=...)")
    inferred = rank is None or world_size is None  # then iter() checks them against torch.distributed's
    rank, world_size = dist_rank_world(rank, world_size)
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise ValueError(f"seed={seed!r} should be a non-negative int (it fixes every epoch's order)")
    if epochs is not None and (isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1):
        raise ValueError(f"epochs={epochs!r} should be a positive int, or None for an endless (step-based) pass")
    blocks = block_options(shuffle, block_frames, window_blocks, (world_size, batch_size))
    if mixture and blocks is not None:
        raise ValueError(f"{shuffle=} is not supported for a mixture of sources; pass shuffle='full' (the default), "
                         "or train on one source")
    checked = sample_transform(transform, method=method, pipe="train_pipe")
    if mixture and (delta_timestamps is not None or check_names(names) != "index"):
        raise ValueError("delta_timestamps= and names= are for a pipe of one source: a mixture's sources may differ "
                         "in fps and names; give its windows in steps (history=/horizon=) and its keys with keys=")
    if mixture:
        return mixture_pipe(index, split=split, batch_size=batch_size, seed=int(seed), history=history,
                            horizon=horizon, rank=rank, world_size=world_size, inferred=inferred, options=options,
                            transform=checked, epochs=epochs, on_resize=on_resize, stop=stop or "cycle")
    idx = open_index(index)
    chosen = choose(idx, split, episodes=episodes, where=where)  # columns, not an Episode per episode
    check_batchable(chosen.schemas(), resize)  # so episode 0's array specs are every episode's
    train_packed.check_trainable(idx, str(idx.root))
    sw = seconds_windows(delta_timestamps, chosen, tolerance_s=tolerance_s, history=history, horizon=horizon,
                         keys=window_keys(chosen))
    windows = plan_windows(sw.history, sw.horizon, cameras=set(chosen[0].cameras), arrays=set(chosen[0].arrays))
    rename = batch_keys(names, idx, chosen, windows)
    stats = Stats()
    reader = train_packed.reader_class(idx)(idx, chosen, windows=windows, seed=int(seed), rank=rank,
                                            world_size=world_size, batch_size=batch_size, epochs=epochs, stats=stats,
                                            on_resize=on_resize, blocks=blocks)
    dec = Decoder(reader, idx, options, stats=stats, transform=checked, frames=train_packed.frames_of(idx),
                  share_frames=True, chunk=task_chunk(options, batch_size), cursor=reader, slices=reader.send_slices)
    per = reader.per_epoch // batch_size
    log.debug("train_pipe: %d frames, %d batches per epoch on rank %d of %d", len(reader.table), per, rank,
              world_size)
    return TrainPipe(keyed(BatchStacker(dec, batch_size=batch_size, stats=stats, rows=dec), rename, sw.trim),
                     length=None if epochs is None else epochs * per, index=idx, stats=stats, reader=reader,
                     rank_world=(rank, world_size) if inferred else None)


def task_chunk(options: DecodeOptions, batch_size: int) -> int:
    """Samples per decode task: at least a batch's share per worker (``ceil(batch / workers)``), threads and
    processes alike: each task costs the parent a future and wake-ups of the pool's threads (processes add messages
    and semaphores), taken under the GIL the decode threads wait for; twice the rows are in flight."""
    return max(CHUNK, -(-batch_size // options.num_workers))


def block_options(shuffle: str, block_frames: int | None, window_blocks: int | None,
                  ranks: tuple[int, int] | None = None) -> tuple | None:
    """``(block_frames, window_blocks)`` of ``shuffle="block"`` (``shuffle="rank_block"`` adds ``ranks``, the
    ``(world_size, batch_size)`` its shares follow), None for the full shuffle; bad options refused."""
    if shuffle not in SHUFFLES:
        raise ValueError(f"{shuffle=} should be one of {SHUFFLES}")
    if shuffle == "full":
        if block_frames is not None or window_blocks is not None:
            raise ValueError(f"{block_frames=} and {window_blocks=} set the block order; pass shuffle='block' too, "
                             "or leave them None")
        return None
    sizes = (bo.check_count("block_frames", bo.DEFAULT_BLOCK_FRAMES if block_frames is None else block_frames),
             bo.check_count("window_blocks", bo.DEFAULT_WINDOW_BLOCKS if window_blocks is None else window_blocks))
    return sizes if shuffle == "block" else (*sizes, ranks)
