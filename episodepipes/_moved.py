"""Module paths the README named before the reshape (issue 24) that now live elsewhere: importing the old name gives
the new module itself (the same object, so registries such as `readers.FORMATS` and monkeypatches are shared).

Lazy: nothing is imported until someone imports an old name. Code in this repository uses the new paths
(scripts/reshape_imports.py rewrites them); this table is for users' code and plugins (reshape: keep).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType

MOVED = {
    "episodepipes.sharding.lock": "episodepipes.sharding.write.lock",  # reshape: keep
    "episodepipes.sharding.readers": "episodepipes.sharding.formats.readers",  # reshape: keep
    "episodepipes.statsfile": "episodepipes.normstats.sidefile",  # reshape: keep
}


class _Alias(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # a placeholder module; `exec_module` puts the real one in its place

    def exec_module(self, module: ModuleType) -> None:
        # The import system returns what sys.modules holds under the name after this call: the moved module.
        sys.modules[module.__name__] = importlib.import_module(self.target)


class MovedFinder(importlib.abc.MetaPathFinder):
    """Finds the old names of `MOVED` and loads them as the modules they moved to."""

    def find_spec(self, name: str, path: object = None,
                  target: object = None) -> importlib.machinery.ModuleSpec | None:
        if name not in MOVED:
            return None
        return importlib.util.spec_from_loader(name, _Alias(MOVED[name]))


def install() -> None:
    """Put the finder first (before an editable install's finder, which would find nothing newer)."""
    if not any(isinstance(f, MovedFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, MovedFinder())
