"""What a user of the installed package gets: type information (PEP 561), the API page's public names, the README's
table of contents."""

import re
from pathlib import Path

import episodepipes

ROOT = Path(__file__).resolve().parents[2]


def test_the_package_is_marked_typed_and_ships_the_marker():
    assert (Path(episodepipes.__file__).parent / "py.typed").is_file()
    section = (ROOT / "pyproject.toml").read_text().split("[tool.setuptools.package-data]\n", 1)[1]
    assert re.match(r'episodepipes = \[[^\]]*"py\.typed"', section), section[:200]  # Python 3.10 has no tomllib


def test_the_api_page_documents_normalize_and_per_source():
    api = (ROOT / "docs" / "API.md").read_text()
    for name in ("Normalize", "PerSource"):
        assert f"\n### {name}\n" in api, name
    assert "#### Normalize.from_stats" in api and "#### Normalize.inverse" in api


def _anchor(heading: str) -> str:
    """GitHub's heading anchor: lower case, punctuation but ``-`` and ``_`` dropped, spaces as ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.replace("`", "").strip().lower()).replace(" ", "-")


def test_the_readme_opens_with_a_table_of_contents_that_links_every_section():
    text = (ROOT / "README.md").read_text()
    heads, fence = [], False
    for line in text.splitlines():
        fence ^= line.startswith("```")
        m = None if fence else re.match(r"^(##|###) (.*)$", line)
        if m:
            heads.append(m.group(2))
    toc = text[:text.index("\n## ")]  # before the first section
    links = re.findall(r"^\s*- \[(.*)\]\(#([^)]*)\)$", toc, flags=re.M)
    assert [h for h, _ in links] == heads and len(heads) > 10
    assert [a for _, a in links] == [_anchor(h) for h in heads]
