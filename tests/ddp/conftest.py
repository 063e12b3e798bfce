"""The local 2-rank fit of app.py, run once per session: test_ddp_fit checks it, and test_ddp_s3 compares its
``s3://`` run of the same shards with it (a fit is among the slowest things in the suite; both need the same one)."""

from __future__ import annotations

import pytest
from ddp.test_ddp_fit import FPS, LENGTH, launch


@pytest.fixture(scope="session")
def ddp_shards(shard_folder):
    # 9 episodes -> val = ep0002, ep0005, ep0008: 3 x 5 frames = 15, split over 2 ranks = 8 + (7 + 1 padded)
    return shard_folder("ddp", num_episodes=9, length=LENGTH, height=32, width=48, fps=FPS, shard_size=30_000)


@pytest.fixture(scope="session")
def ddp_local_run(ddp_shards, tmp_path_factory):
    """Read only: every test of it sees the same ranks' counters, logs and videos."""
    return launch(ddp_shards, tmp_path_factory.mktemp("ddp_out"))
