"""No module reads another module's private attributes (issue 24; STYLE.md point 16: pass the object).

Read from the source, not run: every module of ``episodepipes/`` is parsed, and each private name (one leading
underscore) is owned by the modules that define it: a class's ``self._x`` attributes, its ``_methods`` and fields,
and a module's own ``_functions``, ``_classes`` and ``_GLOBALS``. A read ``obj._x`` (``obj`` not ``self``/``cls``)
in a module that does not own ``_x`` itself, of a name some other module owns, is a private read. Names no module
of the package defines (``os._exit``, a namedtuple's ``_replace``) are not ours and not checked.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "episodepipes"

# (reading module, attribute): why it stays. Every entry must still occur (so a fixed one is removed). None now:
# the last, MixReader calling a reader's _sample, became TrainReader.sample (d333660).
EXCEPTIONS: dict[tuple[str, str], str] = {}

# The index's classes: nobody outside their own module reads their private names, without exception.
INDEX_CLASSES = {"index/episode_index.py": "EpisodeIndex", "index/tables.py": "Tables", "index/episodes.py": "Episode"}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _class_privates(cls: ast.ClassDef) -> set[str]:
    """The private names a class defines: ``self._x`` it assigns, its ``_methods``, its ``_fields``."""
    out = set()
    for node in ast.walk(cls):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _private(node.attr) \
                and isinstance(node.value, ast.Name) and node.value.id == "self":
            out.add(node.attr)
    for stmt in cls.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and _private(stmt.name):
            out.add(stmt.name)
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(stmt, ast.AnnAssign) \
            else []
        out |= {t.id for t in targets if isinstance(t, ast.Name) and _private(t.id)}
    return out


def _module_privates(tree: ast.Module) -> set[str]:
    """The private names a module defines: its classes' and its own top-level ones."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            out |= _class_privates(node)
    for stmt in tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and _private(stmt.name):
            out.add(stmt.name)
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(stmt, ast.AnnAssign) \
            else []
        for t in targets:
            out |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name) and _private(n.id)}
    return out


def _modules(root: Path) -> dict[str, ast.Module]:
    return {p.relative_to(root).as_posix(): ast.parse(p.read_text(), str(p)) for p in sorted(root.rglob("*.py"))}


def _reads(tree: ast.Module) -> Iterator[tuple[int, str, str]]:
    """(line, attribute, the expression) of every ``obj._x`` whose ``obj`` is not ``self`` or ``cls``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr) \
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
            yield node.lineno, node.attr, ast.unparse(node)


def private_reads(root: Path = PACKAGE) -> list[tuple[str, int, str, str]]:
    """(module, line, attribute, expression) of every read of a private name owned only by other modules."""
    modules = _modules(root)
    owners: dict[str, set[str]] = {}
    for name, tree in modules.items():
        for attr in _module_privates(tree):
            owners.setdefault(attr, set()).add(name)
    return [(name, line, attr, text) for name, tree in modules.items() for line, attr, text in _reads(tree)
            if owners.get(attr) and name not in owners[attr]]


def test_no_module_reads_another_modules_private_attributes():
    found = private_reads()
    bad = [f"episodepipes/{m}:{line}: {text}" for m, line, attr, text in found if (m, attr) not in EXCEPTIONS]
    assert not bad, "private reads across modules (pass the object, or give it a public name):\n" + "\n".join(bad)
    stale = set(EXCEPTIONS) - {(m, attr) for m, _, attr, _ in found}
    assert not stale, f"these exceptions no longer occur; remove them from EXCEPTIONS: {sorted(stale)}"


@pytest.mark.parametrize("module", sorted(INDEX_CLASSES))
def test_no_module_reads_the_index_private_attributes(module):
    """Stricter for the index: no exception, and a module defining a name of its own is no excuse."""
    modules = _modules(PACKAGE)
    cls = next(n for n in modules[module].body if isinstance(n, ast.ClassDef) and n.name == INDEX_CLASSES[module])
    names = _class_privates(cls)
    assert names, f"found no private names in {INDEX_CLASSES[module]}: the test reads the wrong class"
    bad = [f"episodepipes/{m}:{line}: {text}" for m, tree in modules.items() if m != module
           for line, attr, text in _reads(tree) if attr in names]
    assert not bad, (f"{INDEX_CLASSES[module]}'s private attributes read outside {module} (use "
                     "EpisodeIndex.tables, load_stats or another public name):\n" + "\n".join(bad))


def test_the_check_finds_a_private_read(tmp_path):
    """The check itself: a planted read across modules is found, reads of one's own names are not."""
    (tmp_path / "owner.py").write_text("class Ix:\n    def __init__(self):\n        self._cols = {}\n"
                                       "    def _check(self, other):\n        return other._cols\n")
    (tmp_path / "reader.py").write_text("def f(ix):\n    return ix._cols, ix._check(ix), ix._unknown\n")
    found = sorted((m, attr) for m, _, attr, _ in private_reads(tmp_path))
    assert found == [("reader.py", "_check"), ("reader.py", "_cols")]
