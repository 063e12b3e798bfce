"""An index in the v1 layout (every episode entry with its segments and offsets), whichever version it was read
from: the form `ShardWriter` and merge take episode entries in, built from the v2 tables on first use.
"""

from __future__ import annotations

from collections.abc import Sequence

from episodepipes.index import v2 as indexv2
from episodepipes.index.columns import PER_FRAME, scanning
from episodepipes.index.tables import Tables
from episodepipes.index.v2 import SEGMENT


def v1_layout(m: dict, t: Tables, ids: Sequence[str]) -> dict:
    """A v2 index as the v1 JSON would hold it (what `ShardWriter` and merge take as episode entries), from its
    metadata ``m``, tables ``t`` and episode ``ids``."""
    with scanning([t.columns[c] for c in PER_FRAME if c in t.columns]):  # every frame, in order: read-around on
        return _layout(m, t, ids)


def _layout(m: dict, t: Tables, ids: Sequence[str]) -> dict:
    seg, off, size, crc, ep = t.segments, t.offset, t.size, t.crc, t.episodes
    episodes = []
    for n, (first, length, j0, schema, split, prompt, fps) in enumerate(ep.tolist()):
        j1 = int(ep[n + 1, SEGMENT]) if n + 1 < len(ep) else len(seg)
        t.check_segments(range(j0, j1), [n] * (j1 - j0))
        segs = []
        for shard, row, count in seg[j0:j1].tolist():
            s = {"shard": shard, "first": row - first, "count": count, "offsets": off[row:row + count].tolist(),
                 "end": int(off[row + count - 1]) + int(size[row + count - 1])}
            if "member" in t.columns:
                s.update(indexv2.packed_spans(t.columns, row, count, first))
            if crc is not None:
                s["crc32"] = crc[row:row + count].tolist()
            segs.append(s)
        sc = m["schemas"][schema]
        episodes.append({"id": ids[n], "split": m["splits"][split], "length": length, "fps": m["fps"][fps],
                         "prompt": m["prompts"][prompt], "cameras": sc["cameras"], "arrays": sc["arrays"],
                         **t.episode_meta.get(n, {}), "segments": segs})
    data = {k: v for k, v in m.items() if k not in indexv2.V2_KEYS}
    return dict(data, version=1, episodes=episodes)
