"""Reading the block order (`block_order`) from a remote root: a window's blocks whole, for one rank.

`TrainReader` keys its read-ahead by ``(epoch, window)`` in the block order: `read_window` fetches every
block of the window that this rank's positions touch (adjacent frames coalesce into one ranged GET, so a
block costs one request), plus the window steps (history/horizon) of this rank's frames, and keeps only
this rank's frames' bytes: views of a GET's body where they are most of it (one rank: no copy), copies
where they are not (several ranks), so that the body goes. The other ranks' frames of those blocks are
transferred and dropped: the blocks are shared by every rank of a window, so each rank reads all of them
(see `train_pipe`). In the rank-sharded order (`order.rank_blocks`) a window's blocks are the rank's own, and
only the blocks a share's cut falls in are read by two ranks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from episodepipes.index import Episode, EpisodeIndex
from episodepipes.pipes.chosen import Chosen
from episodepipes.pipes.order.block_order import BlockLayout, BlockOrder, check_count
from episodepipes.pipes.order.rank_blocks import RankBlockLayout
from episodepipes.pipes.order.shuffle import FrameTable
from episodepipes.pipes.order.window import Window, fields_by_step
from episodepipes.remote.ranges import coalesce

Key = tuple[int, int]  # (epoch, window)


def layout_of(index: EpisodeIndex, episodes: Sequence[Episode], block_frames: int, window_blocks: int,
              ranks: tuple[int, int] | None = None) -> BlockLayout:
    """The blocks of ``episodes``' frames (flat order), cut where the shard changes: from the index's segments
    (`Chosen.runs`), nothing per frame. ``ranks``: ``(world_size, batch_size)`` of the rank-sharded order
    (`rank_blocks`), whose layout deals whole blocks to ranks."""
    runs = Chosen.of(index, episodes).runs()[0]
    block_frames = check_count("block_frames", block_frames)
    layout = BlockLayout.of_runs(runs, block_frames=block_frames, window_blocks=window_blocks)
    if ranks is None:
        return layout
    return RankBlockLayout.ranked(layout, world_size=ranks[0], batch_size=ranks[1])


def positions_in(order: BlockOrder, window: int, *, rank: int, world_size: int, used: int) -> np.ndarray:
    """``rank``'s stream positions in ``window`` (`BlockOrder.positions`; its windows are the rank's own in the
    rank-sharded order)."""
    return order.positions(window, rank=rank, world_size=world_size, used=used)


def following(key: Key, orders: Callable[[int], BlockOrder], *, rank: int, world_size: int, used: int,
              stop: int | None) -> Key | None:
    """The (epoch, window) after ``key`` holding a position of ``rank``, or None past epoch ``stop``.

    Args:
        key: (epoch, window).
        orders: ``orders(epoch)`` -> that epoch's `BlockOrder`.
        rank, world_size: this rank and the number of ranks.
        used: the stream positions an epoch uses (drop-last).
        stop: the first epoch not in the pass, or None (endless).
    """
    epoch, window = key
    if window < int(orders(epoch).window_of(used - world_size + rank)):
        return epoch, window + 1
    if stop is not None and epoch + 1 >= stop:
        return None
    return epoch + 1, int(orders(epoch + 1).window_of(rank))


def frame_ranges(episodes: Chosen, need: Sequence[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(shard, start byte, end byte) of each (episode position, step) of ``need``, looked up together: on a remote
    root one round of column-block GETs for all of them (`EpisodeIndex.frame_ranges`), not a round trip per frame."""
    e = np.fromiter((k[0] for k in need), np.int64, len(need))
    s = np.fromiter((k[1] for k in need), np.int64, len(need))
    return episodes.index.frame_ranges(episodes.firsts[e] + s)


def read_frames(source: object, names: Sequence[str], episodes: Chosen,
                need: Sequence[tuple[int, int]]) -> dict[tuple[int, int], bytes]:
    """(episode position, step) -> the frame's bytes, for each of ``need`` (distinct): a shard's touching or
    overlapping frames read as one range, every shard's in one ``read_many`` (which coalesces near ranges further).

    Args:
        source: the byte source (`read_many`).
        names: shard file names, by shard number.
        episodes: the reader's episodes.
        need: the frames to read.
    """
    if not need:
        return {}
    shard, a, b = frame_ranges(episodes, need)
    runs: dict[int, list[list]] = {}  # shard -> [start, end, frames (positions in need)] in offset order
    for k in np.lexsort((a, shard)).tolist():
        rs = runs.setdefault(int(shard[k]), [])
        if rs and a[k] <= rs[-1][1]:
            rs[-1][1] = max(rs[-1][1], int(b[k]))
            rs[-1][2].append(k)
        else:
            rs.append([int(a[k]), int(b[k]), [k]])
    datas = source.read_many([(names[s], [(lo, hi - lo) for lo, hi, _ in rs])  # type: ignore[attr-defined]
                              for s, rs in runs.items()])
    out: dict[tuple[int, int], bytes] = {}
    for rs, ds in zip(runs.values(), datas):
        for (lo, _, ks), data in zip(rs, ds):
            for k in ks:
                out[need[k]] = data[int(a[k]) - lo:int(b[k]) - lo]  # the whole body itself where it is one frame
    return out


def read_window(source: object, names: Sequence[str], table: FrameTable, episodes: Chosen,
                windows: Mapping[str, Window], layout: BlockLayout, flats: np.ndarray, *,
                steps_of: Callable[[list[int], list[int]], list[Sequence[int]]] | None = None,
                ) -> dict[int, dict[int, memoryview]]:
    """flat -> step -> bytes of ``flats`` (one rank's frames of a window), read with the blocks they lie in.

    Args:
        source: the byte source of a remote root or a reference index (`read_many`, ``options``).
        names: shard file names, by shard number.
        table: the flat frame numbering of ``episodes``.
        episodes: the reader's episodes.
        windows: the reader's history/horizon windows.
        layout: the blocks (`BlockLayout`).
        flats: the frames to return.
        steps_of: ``steps_of(episode positions, steps)`` -> the steps each of those samples reads whole (a packed
            reader's reach back to key frames); None: the step and its window steps.
    """
    need: dict[tuple[int, int], None] = {}  # (episode, step), in order
    blocks = np.unique(layout.block_of(flats))
    for a, z in zip(layout.block_start(blocks).tolist(), layout.block_end(blocks).tolist()):
        need.update((table.locate(f), None) for f in range(a, z))
    located = [table.locate(f) for f in flats.tolist()]
    es, ts = [e for e, _ in located], [t for _, t in located]
    if steps_of is None:
        stepss: list[Sequence[int]] = [(t, *fields_by_step(t, episodes[e].length, windows)) for e, t in located]
    else:
        stepss = steps_of(es, ts)
    mine = []
    for flat, e, steps in zip(flats.tolist(), es, stepss):
        need.update(((e, s), None) for s in steps)
        mine.append((flat, e, steps))
    by_shard: dict[int, list[tuple[tuple[int, int], int, int]]] = {}
    keys = list(need)
    shard, start, end = frame_ranges(episodes, keys)
    for k, sh, a, z in zip(keys, shard.tolist(), start.tolist(), end.tolist()):
        by_shard.setdefault(sh, []).append((k, a, z))
    o = source.options  # type: ignore[attr-defined]  # a RemoteSource's; a reference index's source (its
    # dataset's files) has none: its virtual shards' ranges are merged where they touch
    gap, most, waste = (0, 1 << 62, 0.0) if o is None else (o.gap, o.max_request, o.waste)
    runs = {shard: coalesce([(a, z - a) for _, a, z in frames], gap=gap, max_request=most, waste=waste)
            for shard, frames in by_shard.items()}
    calls = [(names[shard], [(r.start, r.end - r.start) for r in rs]) for shard, rs in runs.items()]
    datas = source.read_many(calls, views=True)  # type: ignore[attr-defined]
    used = {k for _, e, steps in mine for k in ((e, s) for s in steps)}
    views: dict[tuple[int, int], memoryview] = {}
    for (shard, rs), ds in zip(runs.items(), datas):
        frames = by_shard[shard]
        for r, data in zip(rs, ds):
            body = memoryview(data)
            mine_of = [frames[j] for j in r.members if frames[j][0] in used]
            # mostly this rank's frames: views of the GET's body, no copy; else copies, and the body goes
            keep = 2 * sum(z - a for _, a, z in mine_of) >= len(body)
            for k, a, z in mine_of:
                views[k] = body[a - r.start:z - r.start] if keep else memoryview(bytes(body[a - r.start:z - r.start]))
    return {flat: {s: views[e, s] for s in steps} for flat, e, steps in mine}
