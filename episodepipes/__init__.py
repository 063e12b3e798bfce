"""episodepipes: fast, exact, DDP-safe data pipelines for robot-learning video episodes."""

__version__ = "0.1.0"

from episodepipes import _moved

_moved.install()  # old module paths the README named keep importing (episodepipes._moved.MOVED)
