"""Exact, mergeable statistics of the arrays (the public path ``episodepipes.normstats``), their side file and log.

`exact` holds the statistics themselves; `sidefile` the ``index.stats.bin`` codec; `fields` the per-episode parts a
writer adds up; `_leb128` the varints of the side file.
"""

from episodepipes.normstats.exact import (
    KEY_LIMIT,
    MAX_DIMS,
    QUANTILES,
    REL_ERROR,
    SUB_BITS,
    ArrayStats,
    Packed,
    StatsTable,
    add_fresh,
)

__all__ = ["KEY_LIMIT", "MAX_DIMS", "QUANTILES", "REL_ERROR", "SUB_BITS", "ArrayStats", "Packed", "StatsTable",
           "add_fresh"]
