"""``episodepipes-shard show``: a dataset as one self-contained HTML page (videos in sync with plots of the arrays,
episode attributes, and a view of the whole dataset from its index and statistics), reading only the episodes shown.

See README.md in this folder for which module holds what.
"""

from episodepipes.sharding.show.build import MAX_EPISODES, MAX_FRAMES, ShowResult, default_page, show
from episodepipes.sharding.show.read import Counts

__all__ = ["Counts", "MAX_EPISODES", "MAX_FRAMES", "ShowResult", "default_page", "show"]
