"""What a loader holds, read from /proc (no psutil needed): live child processes, their RSS and PSS."""

from __future__ import annotations

import os
from collections.abc import Collection
from pathlib import Path


def descendants(pid: int | None = None) -> list[int]:
    """Pids of every live descendant of ``pid`` (default: this process)."""
    pid = os.getpid() if pid is None else pid
    parent: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
                parent[int(d.name)] = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out += kids
        todo += kids
    return out


def _kb(path: str, key: str) -> int:
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def rss_mb(pid: int) -> float:
    return _kb(f"/proc/{pid}/status", "VmRSS") / 1024


def pss_mb(pid: int) -> float:
    """Proportional set size: shared (forked, copy-on-write) pages split between the processes sharing them."""
    return _kb(f"/proc/{pid}/smaps_rollup", "Pss") / 1024


def held(pid: int | None = None, *, exclude: Collection[int] = ()) -> dict:
    """Live descendant processes of ``pid`` and the memory they hold (RSS and PSS, MB), plus the parent's; ``exclude``
    leaves out processes that were there before the loader measured (e.g. a fork server an earlier pass started)."""
    pid = os.getpid() if pid is None else pid
    kids = [k for k in descendants(pid) if k not in exclude]
    return {"processes": len(kids), "children_rss_mb": sum(map(rss_mb, kids)),
            "children_pss_mb": sum(map(pss_mb, kids)), "tree_rss_mb": rss_mb(pid) + sum(map(rss_mb, kids)),
            "threads": _kb(f"/proc/{pid}/status", "Threads")}
