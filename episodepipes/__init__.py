"""episodepipes: fast, exact, DDP-safe data pipelines for robot-learning video episodes."""

__version__ = "0.1.0"
