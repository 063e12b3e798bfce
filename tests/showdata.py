"""Datasets for the ``show`` tests, written by the project's own writer: synthetic episodes whose text (prompt,
split, attributes, an array's source name) is hostile HTML, as anyone's dataset may be."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from episodepipes.sharding.episode import EpisodeData
from episodepipes.sharding.formats.synthetic import SyntheticReader
from episodepipes.sharding.recompute import add_stats
from episodepipes.sharding.write import WriteOptions, write_shards

# each part tries another way out of where the page puts text: a script element, an attribute, an HTML tag
HOSTILE = '</script><script>window.pwned=1</script>"\'><img src=x onerror="window.pwned=2"><!--'


@dataclasses.dataclass(frozen=True)
class HostileReader(SyntheticReader):
    """`SyntheticReader` episodes with `HOSTILE` in their prompt, attributes and an array's source name (a split is
    train or val when written: `hostile_split` puts it in the index's split names, as a stranger's index may)."""

    def read(self, episode_id: str) -> EpisodeData:
        ep = super().read(episode_id)
        return dataclasses.replace(ep, prompt=f"prompt {HOSTILE}", extra={"note": HOSTILE, "<b>key</b>": 7},
                                   sources={"state": f"state {HOSTILE}"})


def hostile_split(out: Path) -> str:
    """Rename split "val" in ``out``'s index.json to one holding `HOSTILE` (the index accepts any split name) and
    recompute the statistics under it; returns the new name."""
    index = out / "index.json"
    data = json.loads(index.read_text())
    name = f"val {HOSTILE}"
    data["splits"] = [name if s == "val" else s for s in data["splits"]]
    index.write_text(json.dumps(data))
    add_stats(out)  # the statistics' side file names the splits too: computed again under the new names
    return name


def write(out: Path, *, codec: str = "jpeg", hostile: bool = False, shard_size: int = 1 << 20, **shape: object) -> Path:
    """Shard synthetic episodes (``shape``: `SyntheticReader` fields) into ``out`` with ``codec``."""
    reader = (HostileReader if hostile else SyntheticReader)(**shape)  # type: ignore[arg-type]
    opts = WriteOptions(format="synthetic", codec=codec, gop=4, shard_size=shard_size)
    write_shards(reader, out, opts, workers=1)
    return out
