#!/usr/bin/env python
"""Rewrite imports and module paths after issue 24's reshape ("One house"): old module -> new module.

    python scripts/reshape_imports.py            # rewrite files in place, print what changed
    python scripts/reshape_imports.py --check    # exit 1 if any file still names an old path

Idempotent: a second run changes nothing. Run it after merging a branch that still uses the flat layout, then
`ruff check --fix` (import order). It rewrites, in episodepipes/, tests/, scripts/, benchmarks/, docs/ and README.md:
- ``from episodepipes.OLD import a, b`` and ``import episodepipes.OLD [as x]``;
- ``from episodepipes.PKG import old_module [as x]`` (split per new parent, the bound name kept);
- relative imports (``from .remote import ...``, ``from ..shardio import ...``), made absolute, resolved against
  the file's *old* location when the file itself moved;
- dotted paths in strings, comments and docs (``"episodepipes.sharding.raw:factory"``, monkeypatch targets,
  ``python -m episodepipes.x``), and file paths (``episodepipes/indexv2.py``, ``sharding/video.py``).
A module that became a package face (``episodepipes.index``, ``episodepipes.normstats``,
``episodepipes.pipes.train``, ``episodepipes.sharding.write``) keeps its path for the names its ``__all__`` lists;
other names imported from it (private helpers) are pointed at the module that now defines them, and code inside
the face's own package always imports the defining module (no import through its own face).
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# old module -> new module. Keep in step with the `git mv`s of issue 24.
MOVES: dict[str, str] = {
    # index/
    "episodepipes._indexcheck": "episodepipes.index.check",
    "episodepipes.indexepisodes": "episodepipes.index.episodes",
    "episodepipes.indexopen": "episodepipes.index.load",
    "episodepipes.indexrecords": "episodepipes.index.records",
    "episodepipes.indexstats": "episodepipes.index.stats",
    "episodepipes.indexv1": "episodepipes.index.v1",
    "episodepipes.indexv2": "episodepipes.index.v2",
    "episodepipes.indexverify": "episodepipes.index.verify",
    # normstats/
    "episodepipes._leb128": "episodepipes.normstats._leb128",
    "episodepipes.statsfields": "episodepipes.normstats.fields",
    "episodepipes.statsfile": "episodepipes.normstats.sidefile",
    # pipes/order/
    "episodepipes.pipes.permute": "episodepipes.pipes.order.permute",
    "episodepipes.pipes.block_order": "episodepipes.pipes.order.block_order",
    "episodepipes.pipes.mixture": "episodepipes.pipes.order.mixture",
    "episodepipes.pipes.shuffle": "episodepipes.pipes.order.shuffle",
    "episodepipes.pipes.window": "episodepipes.pipes.order.window",
    # pipes/train/
    "episodepipes.pipes.train_mix": "episodepipes.pipes.train.mix",
    "episodepipes.pipes.mix_reader": "episodepipes.pipes.train.mix_reader",
    "episodepipes.pipes.train_packed": "episodepipes.pipes.train.packed",
    "episodepipes.pipes.train_state": "episodepipes.pipes.train.state",
    # pipes/_decode/
    "episodepipes.pipes._executor": "episodepipes.pipes._decode.executor",
    "episodepipes.pipes._pool": "episodepipes.pipes._decode.pool",
    "episodepipes.pipes._sinks": "episodepipes.pipes._decode.sinks",
    "episodepipes.pipes._slabs": "episodepipes.pipes._decode.slabs",
    "episodepipes.pipes._buffers": "episodepipes.pipes._decode.buffers",
    "episodepipes.pipes._batchmemo": "episodepipes.pipes._decode.batchmemo",
    "episodepipes.pipes._mapped": "episodepipes.pipes._decode.mapped",
    "episodepipes.pipes._lifecycle": "episodepipes.pipes._decode.lifecycle",
    # sharding/formats/
    "episodepipes.sharding.raw": "episodepipes.sharding.formats.raw",
    "episodepipes.sharding.zarr_reader": "episodepipes.sharding.formats.zarr_reader",
    "episodepipes.sharding.lerobot": "episodepipes.sharding.formats.lerobot",
    "episodepipes.sharding.lerobot_meta": "episodepipes.sharding.formats.lerobot_meta",
    "episodepipes.sharding.synthetic": "episodepipes.sharding.formats.synthetic",
    "episodepipes.sharding.video": "episodepipes.sharding.formats.video",
    "episodepipes.sharding.readers": "episodepipes.sharding.formats.readers",
    "episodepipes.sharding.imagehead": "episodepipes.sharding.formats.imagehead",
    # sharding/write/
    "episodepipes.sharding.write_plan": "episodepipes.sharding.write.plan",
    "episodepipes.sharding.writer": "episodepipes.sharding.write.writer",
    "episodepipes.sharding.encoders": "episodepipes.sharding.write.encoders",
    "episodepipes.sharding.encode": "episodepipes.sharding.write.encode",
    "episodepipes.sharding.progress": "episodepipes.sharding.write.progress",
    "episodepipes.sharding.progress_stats": "episodepipes.sharding.write.progress_stats",
    "episodepipes.sharding.lock": "episodepipes.sharding.write.lock",
    "episodepipes.sharding.remote_out": "episodepipes.sharding.write.remote_out",
    "episodepipes.sharding._writeback": "episodepipes.sharding.write._writeback",
    "episodepipes.sharding.meter": "episodepipes.sharding.write.meter",
    # sharding/: merge is one module (remote_merge folded in)
    "episodepipes.sharding.remote_merge": "episodepipes.sharding.merge",
}

# old module that is now a package face -> the module its code moved to (the face re-exports its `__all__`)
FACES: dict[str, str] = {
    "episodepipes.index": "episodepipes.index.episode_index",
    "episodepipes.normstats": "episodepipes.normstats.exact",
    "episodepipes.pipes.train": "episodepipes.pipes.train.reader",
    "episodepipes.sharding.write": "episodepipes.sharding.write.shards",
}

TREES = ("episodepipes", "tests", "scripts", "benchmarks", "docs")
FILES = ("README.md",)
SKIP = {"scripts/reshape_imports.py", "scripts/import_figures.py"}  # they hold old names on purpose
SUFFIXES = {".py", ".md", ".txt", ".toml", ".cfg", ".ini", ".json", ".yaml", ".yml", ".sh"}

_FROM = re.compile(r"^(?P<indent>[ \t]*)from[ \t]+(?P<mod>\.*[\w.]*)[ \t]+import[ \t]+(?P<rest>\(.*?\)|[^\n#]*?)"
                   r"(?P<tail>[ \t]*(?:#[^\n]*)?)$", re.M | re.S)
_IMPORT = re.compile(r"^(?P<indent>[ \t]*)import[ \t]+(?P<mod>episodepipes(?:\.\w+)+)(?P<alias>[ \t]+as[ \t]+\w+)?"
                     r"(?P<tail>[ \t]*(?:#[^\n]*)?)$", re.M)
_DOTTED = re.compile(r"(?<![\w.])episodepipes(?:\.\w+)+")
_REL_DOTTED = re.compile(r"(?<![\w./])(?:pipes|sharding)\.\w+(?![\w/])")
_PATH = re.compile(r"(?<![\w./])(?:episodepipes/)?(?:(?:pipes|sharding|remote|codec|lightning_glue)/)?\w+\.py\b")


def _all_of(face: str) -> set[str]:
    """The ``__all__`` of a face package's ``__init__.py``, read without importing it."""
    init = ROOT.joinpath(*face.split("."), "__init__.py")
    if not init.exists():
        return set()
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    return set()


def _is_module(mod: str) -> bool:
    """Whether ``mod`` names a module or package file of this checkout."""
    base = ROOT.joinpath(*mod.split("."))
    return base.with_suffix(".py").exists() or (base / "__init__.py").exists()


def module_of(path: Path) -> str | None:
    """The dotted module name of a file under episodepipes/, or None."""
    rel = path.relative_to(ROOT)
    if rel.parts[0] != "episodepipes" or rel.suffix != ".py":
        return None
    parts = list(rel.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def moved(mod: str) -> str:
    """``mod`` under its new name (a dotted path below a moved module moves with it)."""
    for old, new in MOVES.items():
        if mod == old or mod.startswith(old + "."):
            return new + mod[len(old):]
    return mod


def _split_names(rest: str) -> list[tuple[str, str | None]]:
    body = rest.strip()
    if body.startswith("("):
        body = body[1:-1]
    body = re.sub(r"#[^\n]*", "", body)
    out = []
    for part in body.replace("\n", " ").split(","):
        part = part.strip()
        if not part:
            continue
        name, _, alias = part.partition(" as ")
        out.append((name.strip(), alias.strip() or None))
    return out


def _join(indent: str, mod: str, names: list[tuple[str, str | None]], tail: str) -> str:
    items = ", ".join(f"{n} as {a}" if a else n for n, a in names)
    line = f"{indent}from {mod} import {items}"
    if len(line) + len(tail) > 120 and len(names) > 1:
        inner = "".join(f"{indent}    {n} as {a},\n" if a else f"{indent}    {n},\n" for n, a in names)
        return f"{indent}from {mod} import ({tail.strip() and ' ' + tail.strip()}\n{inner}{indent})"
    return line + tail


def rewrite_from(m: re.Match, here: str | None, old_here: str | None, faces: dict[str, set[str]],
                 is_init: bool = False) -> str:
    mod, rest, indent, tail = m.group("mod"), m.group("rest"), m.group("indent"), m.group("tail")
    if mod.startswith("."):
        if here is None:
            return m.group(0)
        level = len(mod) - len(mod.lstrip("."))
        parts = (old_here or here).split(".")
        if not (is_init and old_here is None):
            parts = parts[:-1]  # a module's relative imports start at its package
        parts = parts[: len(parts) - (level - 1)]
        target = ".".join([*parts, *filter(None, [mod.lstrip(".")])])
        if old_here is None and target not in FACES and moved(target) == target and all(
                moved(f"{target}.{n}") == f"{target}.{n}" for n, _ in _split_names(rest)):
            return m.group(0)  # a relative import in a file that stayed, to modules that stayed
        mod = target
    elif not mod.startswith("episodepipes"):
        return m.group(0)
    names = _split_names(rest)
    if not names or names == [("*", None)]:
        return f"{indent}from {moved(mod)} import {rest}{tail}" if moved(mod) != mod else m.group(0)
    groups: dict[str, list[tuple[str, str | None]]] = {}
    for name, alias in names:
        full = f"{mod}.{name}"
        if moved(full) != full:  # `from episodepipes.pipes import train_mix`: a module that moved
            new = moved(full)
            parent, leaf = new.rsplit(".", 1)
            groups.setdefault(parent, []).append((leaf, alias or (name if leaf != name else None)))
        elif mod in FACES and not _is_module(full) and (
                name not in faces[mod] or (here or "").startswith(mod + ".") or here == mod):
            groups.setdefault(FACES[mod], []).append((name, alias))
        else:
            groups.setdefault(moved(mod), []).append((name, alias))
    if list(groups) == [m.group("mod")]:
        return m.group(0)
    return "\n".join(_join(indent, g, ns, tail if i == 0 else "") for i, (g, ns) in enumerate(groups.items()))


def rewrite_text(text: str, here: str | None, old_here: str | None, faces: dict[str, set[str]],
                 python: bool, is_init: bool = False) -> str:
    """``text`` with every old module path replaced; ``here``/``old_here``: the file's module now and before.
    A line holding ``reshape: keep`` names old paths on purpose (aliases, their tests) and is left alone."""
    kept: list[str] = []

    def keep(m: re.Match) -> str:
        kept.append(m.group(0))
        return f"\x00{len(kept) - 1}\x00"

    text = re.sub(r"^.*reshape: keep.*$", keep, text, flags=re.M)
    text = _rewrite(text, here, old_here, faces, python, is_init)
    return re.sub(r"\x00(\d+)\x00", lambda m: kept[int(m.group(1))], text)


def _rewrite(text: str, here: str | None, old_here: str | None, faces: dict[str, set[str]], python: bool,
             is_init: bool) -> str:
    if python:
        text = _FROM.sub(lambda m: rewrite_from(m, here, old_here, faces, is_init), text)
        text = _IMPORT.sub(lambda m: f"{m.group('indent')}import {moved(m.group('mod'))}{m.group('alias') or ''}"
                           f"{m.group('tail')}", text)
    text = _DOTTED.sub(lambda m: moved(m.group(0)), text)
    text = _REL_DOTTED.sub(lambda m: moved("episodepipes." + m.group(0))[len("episodepipes."):], text)
    text = _PATH.sub(_rewrite_path, text)
    return text


def _rewrite_path(m: re.Match) -> str:
    path = m.group(0)
    full = path if path.startswith("episodepipes/") else "episodepipes/" + path
    mod = full[:-3].replace("/", ".")
    new = moved(mod)
    if new == mod:
        return path
    out = new.replace(".", "/") + ".py"
    return out if path.startswith("episodepipes/") else out[len("episodepipes/"):]


def files() -> list[Path]:
    out = [ROOT / f for f in FILES if (ROOT / f).exists()]
    for tree in TREES:
        out += [p for p in sorted((ROOT / tree).rglob("*")) if p.is_file() and p.suffix in SUFFIXES
                and ".venv" not in p.parts and "__pycache__" not in p.parts]
    return [p for p in out if str(p.relative_to(ROOT)) not in SKIP]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="exit 1 if a file still names an old path; write nothing")
    args = ap.parse_args(argv)
    faces = {face: _all_of(face) for face in FACES}
    back = {new: old for old, new in {**MOVES, **FACES}.items()}
    changed = []
    for path in files():
        text = path.read_text()
        here = module_of(path)
        new = rewrite_text(text, here, back.get(here or ""), faces, python=path.suffix == ".py",
                           is_init=path.name == "__init__.py")
        if new != text:
            changed.append(path.relative_to(ROOT))
            if not args.check:
                path.write_text(new)
    for p in changed:
        print(("stale: " if args.check else "rewrote: ") + str(p))
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
