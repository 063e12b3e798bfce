"""Every `episodepipes.x.y` path the README names resolves (issue 24: the reshape keeps users' import paths)."""

import importlib
import re
from pathlib import Path

import pytest

from episodepipes._moved import MOVED

README = Path(__file__).resolve().parents[2] / "README.md"
NOT_MODULES = {"episodepipes.formats"}  # the entry-point group name, not a module
PATHS = sorted(set(re.findall(r"(?<![\w.])episodepipes(?:\.[A-Za-z_]\w*)+", README.read_text())) - NOT_MODULES)


def resolve(path: str) -> object:
    """The module or attribute ``path`` names: the longest importable module prefix, then attributes."""
    parts = path.split(".")
    for n in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:n]))
        except ModuleNotFoundError:
            continue
        for attr in parts[n:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(path)


def test_the_readme_names_module_paths():
    assert len(PATHS) >= 10


@pytest.mark.parametrize("path", PATHS)
def test_every_module_path_the_readme_names_imports(path):
    assert resolve(path) is not None


@pytest.mark.parametrize("old, new", sorted(MOVED.items()))
def test_moved_paths_the_old_readme_named_are_the_same_modules(old, new):
    assert importlib.import_module(old) is importlib.import_module(new)
    assert Path(importlib.import_module(old).__file__).is_relative_to(README.parent / "episodepipes")  # this checkout
