"""The ``show`` command of ``episodepipes-shard``: its arguments and its run (`episodepipes.sharding.cli` calls
`add_parser` and `run`)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from episodepipes.sharding.show.build import MAX_EPISODES, MAX_FRAMES

PORT = 8000


def add_parser(sub: argparse._SubParsersAction, root: Callable[[str], object]) -> None:
    """The ``show`` subcommand's parser; ``root`` parses OUT (a folder, or a remote root kept as a URL)."""
    s = sub.add_parser("show", help="write one self-contained HTML page: episodes' videos in sync with plots of "
                                    "their arrays, attributes, and the dataset's splits, lengths and statistics")
    s.add_argument("out", type=root, metavar="OUT", help="a shard folder, or a remote root (s3://bucket/prefix, "
                   "gs://..., https://...) read with the standard environment; only the shown episodes are read")
    s.add_argument("episodes", nargs="*", metavar="EPISODE",
                   help="episode ids to show (default: the first --max-episodes in index order)")
    s.add_argument("--page", type=Path, default=None, metavar="FILE",
                   help="the HTML file to write (default: <last part of OUT>.html in the current folder)")
    s.add_argument("--max-episodes", type=int, default=MAX_EPISODES, metavar="N",
                   help=f"show at most N episodes (default {MAX_EPISODES}); each one's videos are inside the page")
    s.add_argument("--max-frames", type=int, default=MAX_FRAMES, metavar="N",
                   help=f"show each episode's first N frames (default {MAX_FRAMES}); the page says where it cut one")
    s.add_argument("--serve", action="store_true",
                   help="then serve the page at http://127.0.0.1:PORT/ (this machine only) until Ctrl-C")
    s.add_argument("--port", type=int, default=None, help=f"--serve: the port, 0 for any free one (default {PORT})")


def run(a: argparse.Namespace, say: Callable[[str], None]) -> int:
    """Write the page (and serve it with ``--serve``); ``say`` prints a line for the user."""
    from episodepipes.sharding.show.build import show

    if a.port is not None and not a.serve:
        raise ValueError(f"--port {a.port} applies to --serve only; add --serve or drop --port")
    port = PORT if a.port is None else a.port
    if not 0 <= port <= 65535:
        raise ValueError(f"--port {port} must be within 0..65535 (0: any free port)")
    res = show(a.out, a.episodes, page_path=a.page, max_episodes=a.max_episodes, max_frames=a.max_frames)
    say(f"wrote {res.page} ({res.page.stat().st_size / 1e6:.1f} MB): {len(res.episodes)} episodes, "
        f"{sum(res.frames)} frames; read {res.counts.bytes} bytes of {len(res.counts.shards)} shards")
    if a.serve:
        from episodepipes.sharding.show.serve import serve

        serve(res.page, port, say)
    return 0
