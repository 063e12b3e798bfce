"""The shard writer (the public path ``episodepipes.sharding.write``): `write_shards` and its options and result.

See README.md in this folder for which module holds what. The face loads `shards` on first use (PEP 562), so the
tools that need only a piece of the writer (`lock`, `progress`) do not pull in the whole write pipeline.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["DiskFullError", "WriteOptions", "WriteResult", "job_dir", "source_fingerprint", "write_shards"]


def __getattr__(name: str) -> Any:
    if name == "DiskFullError":
        from episodepipes.errors import DiskFullError

        return DiskFullError
    if name in __all__:
        return getattr(importlib.import_module("episodepipes.sharding.write.shards"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
