"""Import-graph figures of `episodepipes` (issue 24): import circles, imports that run up a layer, modules per folder.

Run from a checkout: ``PYTHONPATH=$PWD python scripts/import_figures.py [--no-type-checking]``. Works on the flat
layout (before the reshape) and on the packaged one, by mapping each module name to the layer it belongs to.
"""

from __future__ import annotations

import argparse
import collections
import sys

import grimp

# Layers, top first (DESIGN.md "Layout"). A module's layer is found by the first prefix that matches its dotted name
# below `episodepipes.`; old flat names and new package names both appear.
LAYERS: list[tuple[str, ...]] = [
    ("lightning_glue",),
    ("pipes", "sharding"),
    ("index", "indexopen", "indexv1", "indexv2", "indexepisodes", "indexrecords", "indexstats", "indexverify",
     "_indexcheck"),
    ("shardio",),
    ("remote", "codec", "normstats", "statsfields", "statsfile", "_leb128"),
    ("errors", "format", "filebytes", "tarmembers", "episode_attrs", "safefile", "_moved", "imagehead", "_deathsig"),
]


def layer(module: str) -> int | None:
    """The layer number of ``module`` (0 = top), or None for the package itself."""
    parts = module.split(".")
    if len(parts) < 2:
        return None
    for n, names in enumerate(LAYERS):
        if parts[1] in names:
            return n
    raise SystemExit(f"{module} is in no layer of scripts/import_figures.py's LAYERS; add it")


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            node, it = work[-1]
            for nxt in it:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(sorted(edges.get(nxt, ())))))
                    break
                if nxt in on:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        m = stack.pop()
                        on.discard(m)
                        comp.append(m)
                        if m == node:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--no-type-checking", action="store_true", help="leave out imports under `if TYPE_CHECKING:`")
    ap.add_argument("--verbose", action="store_true", help="list each circle and each upward import")
    args = ap.parse_args()
    g = grimp.build_graph("episodepipes", cache_dir=None, exclude_type_checking_imports=args.no_type_checking)
    mods = sorted(g.modules)
    # A package's __init__ re-exports its children; count edges between modules, not into a package face.
    edges = {m: {i for i in g.find_modules_directly_imported_by(m) if i != m} for m in mods}
    circles = cycles(edges)
    up = [(m, i) for m in mods for i in sorted(edges[m])
          if layer(m) is not None and layer(i) is not None and layer(i) < layer(m)]
    folders = collections.Counter(m.rsplit(".", 1)[0] if not g.find_children(m) else m for m in mods)
    print(f"modules: {len(mods)}  import edges: {sum(map(len, edges.values()))}")
    print(f"import circles (strongly connected groups): {len(circles)}, modules in them: {sum(map(len, circles))}")
    print(f"imports that run up a layer: {len(up)}")
    print("modules per folder: " + ", ".join(f"{k}={v}" for k, v in sorted(folders.items())))
    if args.verbose:
        for c in circles:
            print("circle:", " ".join(c))
        for m, i in up:
            print("up:", m, "->", i)
    sys.exit(0)


if __name__ == "__main__":
    main()
