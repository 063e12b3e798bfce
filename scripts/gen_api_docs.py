#!/usr/bin/env python
"""Write docs/API.md, the API reference, from the docstrings of every public name.

    python scripts/gen_api_docs.py           # rewrite docs/API.md (also: make docs)
    python scripts/gen_api_docs.py --check   # exit 1 if docs/API.md differs from the docstrings

Public means listed in the ``__all__`` of a package (or module) in `PACKAGES`, plus the public methods and
properties of those classes. `render` builds the page (deterministic: no addresses, no dates, no
environment), and `problems` lists what is undocumented: a name without its own docstring, or a
parameter not described in a Google-style ``Args:`` section (``Attributes:`` also counts for a
class's fields). tests/project/test_docs.py checks both.

Stdlib `inspect` is enough here: the docstrings are Google-style text that reads fine as Markdown
once sections become lists, and a tool such as pdoc would add a dependency and an HTML site where
one Markdown page, diffable in review, is what the README links to.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ForwardRef

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "API.md"
# Packages, and the modules whose public names are imported from the module itself (not re-exported by a
# package): `Normalize` and `PerSource` were missing from the page while only packages were listed here.
PACKAGES = ("episodepipes.pipes", "episodepipes.pipes.normalize", "episodepipes.sharding",
            "episodepipes.lightning_glue")
PARAM_SECTIONS = {"Args", "Arguments", "Attributes"}
SECTIONS = PARAM_SECTIONS | {"Returns", "Yields", "Raises", "Example", "Examples", "Note", "Notes"}
_SECTION = re.compile(r"^({}):\s*$".format("|".join(sorted(SECTIONS))))
_ENTRY = re.compile(r"^([*\w][\w, *]*?)\s*(?:\([^)]*\))?:\s*(.*)$")  # "name: text", "a, b: text", "x (int): text"


# ---------------------------------------------------------------- reading docstrings

def own_doc(obj: Any) -> str | None:
    """The docstring ``obj`` itself carries: not a base class's, nor the one `dataclasses` makes up."""
    if inspect.isclass(obj):
        doc = obj.__dict__.get("__doc__")
        if doc and dataclasses.is_dataclass(obj) and doc.startswith(f"{obj.__name__}("):
            return None  # dataclasses set __doc__ to the signature when the class has none
        return inspect.cleandoc(doc) if doc else None
    doc = getattr(obj, "__doc__", None)
    return inspect.cleandoc(doc) if doc else None


def split_sections(doc: str) -> list[tuple[str | None, list[str]]]:
    """[(section name or None for free text, its lines dedented)] in order."""
    out: list[tuple[str | None, list[str]]] = [(None, [])]
    for line in doc.splitlines():
        m = _SECTION.match(line)
        if m:
            out.append((m.group(1), []))
        elif out[-1][0] is not None and line and not line[0].isspace():
            out.append((None, [line]))  # a section ends at the first unindented line
        else:
            out[-1][1].append(line)
    return [(name, _dedent(lines)) for name, lines in out]


def _dedent(lines: list[str]) -> list[str]:
    width = min((len(x) - len(x.lstrip()) for x in lines if x.strip()), default=0)
    return [x[width:] for x in lines]


def entries(lines: list[str]) -> Iterator[tuple[list[str], str]]:
    """(names, description) per entry of an Args-like section; continuation lines are indented."""
    names: list[str] | None = None
    text: list[str] = []
    for line in lines:
        m = _ENTRY.match(line) if line and not line[0].isspace() else None
        if m:
            if names is not None:
                yield names, " ".join(text)
            names = [n.strip().lstrip("*") for n in m.group(1).split(",") if n.strip()]
            text = [m.group(2).strip()]
        elif names is not None and line.strip():
            text.append(line.strip())
    if names is not None:
        yield names, " ".join(text)


def described(doc: str | None) -> set[str]:
    """Names described with a non-empty text in the ``Args:``/``Attributes:`` sections of ``doc``."""
    if not doc:
        return set()
    return {n for name, lines in split_sections(doc) if name in PARAM_SECTIONS
            for names, text in entries(lines) if text for n in names}


# ---------------------------------------------------------------- what is public

def public_names(packages: tuple[str, ...] = PACKAGES) -> list[tuple[str, str, Any]]:
    """(package, name, object) for every name in each package's ``__all__``, first package first."""
    seen: set[int] = set()
    out = []
    for pkg in packages:
        mod = importlib.import_module(pkg)
        for name in mod.__all__:
            obj = getattr(mod, name)
            if id(obj) not in seen:
                seen.add(id(obj))
                out.append((pkg, name, obj))
    return out


def _ours(cls: type, packages: tuple[str, ...]) -> bool:
    return cls.__module__.split(".")[0] in {p.split(".")[0] for p in packages}


def _protocols(packages: tuple[str, ...]) -> list[type]:
    return [o for _, _, o in public_names(packages) if inspect.isclass(o) and getattr(o, "_is_protocol", False)]


def members(cls: type, packages: tuple[str, ...] = PACKAGES) -> tuple[list[tuple[str, Any, type]],
                                                                      dict[str, list[str]]]:
    """Public methods/properties this library defines on ``cls`` as (name, member, owner), and the
    names implementing an outside base or a public protocol, as {that class's name: [member names]}.

    A method that overrides a torchdata or Lightning hook (``reset``, ``next``, ``setup``...) or
    implements a public protocol of ours is documented by that contract, so only its name is listed.
    """
    contracts = [b for b in cls.__mro__[1:] if not _ours(b, packages) and b is not object]
    contracts += [p for p in _protocols(packages) if p is not cls and _implements(cls, p)]
    own, implements, seen = [], {}, set()
    for klass in cls.__mro__:
        if not _ours(klass, packages) or getattr(klass, "_is_protocol", False) and klass is not cls:
            continue
        for name, raw in vars(klass).items():
            if name.startswith("_") or name in seen or not _is_member(raw):
                continue
            seen.add(name)
            owner = next((c for c in contracts if name in _names(c)), None)
            if owner is not None:
                implements.setdefault(owner.__name__, []).append(name)
            else:
                own.append((name, raw, klass))
    return own, implements


def member_doc(cls: type, name: str, packages: tuple[str, ...] = PACKAGES) -> str | None:
    """A member's docstring, or that of the method it overrides in one of our base classes."""
    for klass in cls.__mro__:
        raw = vars(klass).get(name)
        if _ours(klass, packages) and raw is not None and _is_member(raw):
            doc = own_doc(_callable_of(raw))
            if doc:
                return doc
    return None


def _names(cls: type) -> set[str]:
    return {n for k in cls.__mro__ if k is not object for n in vars(k)}


def _implements(cls: type, proto: type) -> bool:
    try:
        return issubclass(cls, proto)
    except TypeError:
        return False


def _is_member(raw: Any) -> bool:
    return isinstance(raw, property | classmethod | staticmethod) or inspect.isfunction(raw)


def _callable_of(raw: Any) -> Any:
    if isinstance(raw, classmethod | staticmethod):
        return raw.__func__
    return raw.fget if isinstance(raw, property) else raw


def params(obj: Any, *, bound: bool = False) -> list[inspect.Parameter]:
    """The parameters a caller passes (no ``self``/``cls``); none for exceptions and protocols."""
    if inspect.isclass(obj) and (issubclass(obj, BaseException) or getattr(obj, "_is_protocol", False)):
        return []
    try:
        ps = list(inspect.signature(obj).parameters.values())
    except (TypeError, ValueError):
        return []
    return ps[1:] if bound and ps and ps[0].name in ("self", "cls") else ps


# ---------------------------------------------------------------- the check

def problems(packages: tuple[str, ...] = PACKAGES) -> list[str]:
    """Every undocumented public name (``pkg.Name``) and argument (``pkg.Name(arg)``), sorted."""
    out: list[str] = []
    for pkg, name, obj in public_names(packages):
        qual = f"{pkg}.{name}"
        doc = own_doc(obj)
        out += [] if doc else [qual]
        if inspect.isclass(obj):
            init = obj.__dict__.get("__init__")
            have = described(doc) | described(own_doc(init) if init else None)
            out += [f"{qual}({p.name})" for p in params(obj) if p.name not in have]
            for mname, raw, _ in members(obj, packages)[0]:
                fn = _callable_of(raw)
                mdoc = member_doc(obj, mname, packages)
                mqual = f"{qual}.{mname}"
                out += [] if mdoc else [mqual]
                if not isinstance(raw, property):
                    out += [f"{mqual}({p.name})" for p in params(fn, bound=not isinstance(raw, staticmethod))
                            if p.name not in described(mdoc)]
        elif callable(obj):
            out += [f"{qual}({p.name})" for p in params(obj) if p.name not in described(doc)]
    return sorted(set(out))


# ---------------------------------------------------------------- rendering

class _Name:
    """A default value shown by name (a function's repr carries its memory address)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _annotation(a: Any) -> str:
    if isinstance(a, ForwardRef):  # NamedTuple fields under `from __future__ import annotations`
        a = a.__forward_arg__
    return a if isinstance(a, str) else inspect.formatannotation(a)


def signature(name: str, obj: Any, *, bound: bool = False) -> str:
    """``name(params) -> ret``, one parameter per line when it is long; stable across runs."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return name
    parts, star = [], False
    for p in params(obj, bound=bound):
        if p.kind is p.KEYWORD_ONLY and not star:
            parts.append("*")
        star = star or p.kind in (p.KEYWORD_ONLY, p.VAR_POSITIONAL)
        text = {p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "") + p.name
        if p.annotation is not p.empty:
            text += f": {_annotation(p.annotation)}"
        if p.default is not p.empty:
            d = p.default
            d = _Name(f"{d.__module__}.{d.__qualname__}") if callable(d) and hasattr(d, "__qualname__") else d
            text += f" = {d!r}" if p.annotation is not p.empty else f"={d!r}"
        parts.append(text)
    ret = sig.return_annotation
    ret = "" if ret is sig.empty or inspect.isclass(obj) else f" -> {_annotation(ret)}"
    one = f"{name}({', '.join(parts)}){ret}"
    return one if len(one) <= 100 else f"{name}(\n" + "".join(f"    {x},\n" for x in parts) + f"){ret}"


_CODE = re.compile(r"(`+)(.+?)\1")


def _md_text(line: str) -> str:
    """Escape what Markdown would swallow (``<id>`` reads as an HTML tag) outside code spans."""
    out, pos = [], 0
    for m in _CODE.finditer(line):
        out += [line[pos:m.start()].replace("<", "&lt;"), m.group(0)]
        pos = m.end()
    out.append(line[pos:].replace("<", "&lt;"))
    return "".join(out)


def markdown(doc: str | None) -> list[str]:
    """A docstring as Markdown: free text kept (RST ``::`` blocks stay indented code), sections as lists."""
    if not doc:
        return ["*Not documented yet.*", ""]
    lines: list[str] = []
    for name, body in split_sections(doc):
        if name is None:
            lines += [x if x.startswith("    ") else _md_text(x.replace("::", ":") if x.endswith("::") else x)
                      for x in body]
        elif name in PARAM_SECTIONS or name == "Raises":
            lines += ["", f"**{name}:**", ""]
            lines += [f"- {', '.join(f'`{n}`' for n in names)}: {_md_text(text)}" for names, text in entries(body)]
        else:
            lines += ["", f"**{name}:**", "", *(_md_text(x) if not x.startswith("    ") else x for x in body)]
        lines.append("")
    text = "\n".join(lines)
    return re.sub(r"\n{3,}", "\n\n", text).strip("\n").splitlines() + [""]


def _kind(obj: Any) -> str:
    if inspect.isclass(obj):
        if issubclass(obj, BaseException):
            return "exception"
        if getattr(obj, "_is_protocol", False):
            return "protocol"
        return "dataclass" if dataclasses.is_dataclass(obj) else "class"
    return "function"


def _anchor(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def render(packages: tuple[str, ...] = PACKAGES) -> str:
    """The whole of docs/API.md."""
    names = public_names(packages)
    lines = ["# API reference", "",
             "Generated from the docstrings by `scripts/gen_api_docs.py` (`make docs`); do not edit by hand.",
             "`tests/project/test_docs.py` fails when this page is stale or a public name or argument is undocumented.",
             "Concepts, the CLI and the shard format are in the [README](../README.md).", ""]
    for pkg in packages:
        own = [n for p, n, _ in names if p == pkg]
        lines.append(f"- [`{pkg}`](#{_anchor(pkg)}): " + ", ".join(f"[`{n}`](#{_anchor(n)})" for n in own))
    lines.append("")
    for pkg in packages:
        lines += [f"## {pkg}", "", *markdown(own_doc(importlib.import_module(pkg)))]
        for p, name, obj in names:
            if p == pkg:
                lines += _render_name(name, obj, packages)
        modules = sorted({obj.__module__ for p, _, obj in names if p == pkg} - {pkg})
        lines += ["### Module notes", "", "The docstrings of the modules that define the names above.", ""]
        for m in modules:
            lines += [f"#### {m}", "", *markdown(own_doc(importlib.import_module(m)))]
    return "\n".join(lines).rstrip("\n") + "\n"


def _render_name(name: str, obj: Any, packages: tuple[str, ...]) -> list[str]:
    where = f"{obj.__module__}.{obj.__qualname__}" if hasattr(obj, "__qualname__") else obj.__module__
    lines = [f"### {name}", "", f"*{_kind(obj)}* `{where}`", "", "```python", signature(name, obj), "```", "",
             *markdown(own_doc(obj))]
    if inspect.isclass(obj):
        init = obj.__dict__.get("__init__")
        if init is not None and own_doc(init):
            lines += markdown(own_doc(init))
        own, implements = members(obj, packages)
        for mname, raw, _ in own:
            fn = _callable_of(raw)
            head = f"{name}.{mname}"
            sig = head if isinstance(raw, property) else signature(head, fn, bound=not isinstance(raw, staticmethod))
            tag = "property" if isinstance(raw, property) else "classmethod" if isinstance(raw, classmethod) else ""
            lines += [f"#### {head}", "", *([f"*{tag}*", ""] if tag else []), "```python", sig, "```", "",
                      *markdown(member_doc(obj, mname, packages))]
        for base, ms in sorted(implements.items()):
            lines += [f"Implements `{base}`: " + ", ".join(f"`{m}`" for m in ms) + ".", ""]
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="exit 1 if docs/API.md is stale instead of writing it")
    a = ap.parse_args(argv)
    text = render()
    if a.check:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT.relative_to(ROOT)} is stale; run: python scripts/gen_api_docs.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(ROOT)}")
    for p in problems():
        print(f"undocumented: {p}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())

