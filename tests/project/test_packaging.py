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
