#!/usr/bin/env python
"""Shard episodes into WebDataset tars plus an index; see `python scripts/shard.py --help`.

The same CLI is installed as the console script `episodepipes-shard`.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from episodepipes.sharding.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
