"""The frame rates an overlay video stores, checked where they are used: by `AtomicMp4`, and by
`OverlayVideoWriter` on every rank when validation starts (an index's ``fps`` is the dataset's, so any finite
positive number may arrive, and ``1e308`` used to pass until the first render pass died inside the encoder).
"""

from __future__ import annotations

from episodepipes.format import finite

# Frame rates an overlay video stores, in frames per second. MPEG-4 Part 2 (OpenCV's mp4v) keeps the rate in a 16-bit
# time base, so it refuses 100000; OpenCV refuses rates of 0.001 and below; PyAV's H.264 takes 1e-4 to 1e7 and dies
# with OverflowError at 2**31. Both encoders store every rate in this range (tests/hostile/test_hostile_videos.py).
MIN_FPS, MAX_FPS = 0.01, 10_000.0
FPS_RANGE = (MIN_FPS, MAX_FPS)


def fps_problem(fps: object) -> str | None:
    """Why ``fps`` cannot be an overlay video's frame rate, or None when it can."""
    if isinstance(fps, bool) or not isinstance(fps, (int, float)) or not finite(fps):
        return "is not a finite number"
    if not MIN_FPS <= fps <= MAX_FPS:
        return f"is outside {MIN_FPS:g}..{MAX_FPS:g}, the frame rates an mp4 of either encoder stores"
    return None


def check_fps(fps: object) -> float:
    """``fps`` as a float if an overlay video can store it (`FPS_RANGE`), else a ValueError naming it."""
    problem = fps_problem(fps)
    if problem:
        raise ValueError(f"fps={fps!r} {problem}; it should be the episode's source frame rate from the index")
    return float(fps)  # type: ignore[arg-type]
