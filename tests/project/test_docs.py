"""docs/API.md is generated from the docstrings, is current, and every public name and argument is documented.

The names and arguments not documented yet are listed in tests/undocumented.txt, a list that may only shrink.
"""

import sys
import textwrap
from pathlib import Path

import pytest

from scripts import gen_api_docs as gen

ROOT = Path(__file__).resolve().parents[2]
ALLOW = ROOT / "tests" / "undocumented.txt"


def _allowed() -> set[str]:
    return {x.strip() for x in ALLOW.read_text().splitlines() if x.strip() and not x.startswith("#")}


def test_every_public_name_and_builder_argument_is_documented():
    new = sorted(set(gen.problems()) - _allowed())
    assert not new, ("undocumented public names or arguments (add a docstring, describe each argument under "
                     "'Args:', each field under 'Attributes:', then run `make docs`):\n  " + "\n  ".join(new))


def test_the_undocumented_list_only_shrinks():
    done = sorted(_allowed() - set(gen.problems()))
    assert not done, (f"documented now (or gone), so delete these lines from {ALLOW.name}:\n  " + "\n  ".join(done))


def test_api_md_is_regenerated():
    assert (ROOT / "docs" / "API.md").read_text() == gen.render(), \
        "docs/API.md is stale: run `make docs` (python scripts/gen_api_docs.py) and commit it"


def test_api_md_covers_every_builder_argument_and_the_apis_users_call():
    page = gen.render()
    from episodepipes.pipes import metric_pipe, train_pipe, video_pipe

    for fn in (metric_pipe, video_pipe, train_pipe):
        sig = page.split(f"### {fn.__name__}\n", 1)[1].split("```", 2)[1]
        for p in gen.params(fn):
            assert f"    {p.name}:" in sig, f"{fn.__name__}({p.name}) missing from docs/API.md"
    for heading in ("#### EpisodeIndex.open", "#### EpisodeIndex.split", "#### EpisodeIndex.episode",
                    "#### EpisodeIndex.verify", "### write_shards", "### WriteOptions", "### EpisodeReader",
                    "### register_format", "### ValLoaders", "### OverlayVideoWriter"):
        assert f"\n{heading}\n" in page, heading


FAKE = '''
"""A package the checker is tested on."""
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

__all__ = ["Good", "Impl", "NoDoc", "Reader", "f"]


def f(a: int, b: int = 0, *, c=print) -> int:
    """Add.

    Args:
        a: the first.
        b, c: the others,
            on two lines.
    """


def g(x):  # not in __all__: not public
    ...


@dataclass
class NoDoc:
    x: int


class Good:
    """A class.

    Args:
        y: a thing.
    """

    def __init__(self, y: int, z: int) -> None: ...

    def method(self, q: int, r: int) -> None:
        """Do.

        Args:
            q: how much.
            r:
        """

    def bare(self) -> None: ...

    @property
    def prop(self) -> int: ...

    def _private(self, u) -> None: ...


@runtime_checkable
class Reader(Protocol):
    """A protocol."""

    def read(self, k: str) -> str:
        """Read ``k``.

        Args:
            k: the key.
        """


class Impl:
    """Implements `Reader` without saying so."""

    def read(self, k: str) -> str:
        return k
'''


@pytest.fixture
def fake(tmp_path, monkeypatch):
    (tmp_path / "fakedocs").mkdir()
    (tmp_path / "fakedocs" / "__init__.py").write_text(textwrap.dedent(FAKE))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield ("fakedocs",)
    sys.modules.pop("fakedocs", None)


def test_the_checker_finds_each_kind_of_missing_documentation(fake):
    # an argument described with no text (r:) counts as undocumented; a protocol's implementation is documented
    assert gen.problems(fake) == ["fakedocs.Good(z)", "fakedocs.Good.bare", "fakedocs.Good.method(r)",
                                  "fakedocs.Good.prop", "fakedocs.NoDoc", "fakedocs.NoDoc(x)"]


def test_render_is_deterministic_and_markdown_safe(fake):
    page = gen.render(fake)
    assert page == gen.render(fake)
    assert "0x" not in page and "c=builtins.print" in page  # a default function by name, not by address
    assert "Implements `Reader`: `read`." in page
    assert "- `b`, `c`: the others, on two lines." in page
    assert "*Not documented yet.*" in page.split("### NoDoc", 1)[1]


def test_markdown_escapes_angle_brackets_outside_code():
    assert gen._md_text("SRC/<id>/ and `<id>`") == "SRC/&lt;id>/ and `<id>`"
