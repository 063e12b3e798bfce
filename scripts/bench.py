#!/usr/bin/env python
"""Run the benchmark sections side by side in one run and write docs/BENCHMARKS.md plus PNG plots.

Every section measures episodepipes against the baseline a competent user would otherwise write,
and against the hardware ceiling, in the same run. Throughput is reported as ratios of runs made
side by side (absolute rates on a shared 2-core machine move with other load); costs whose
denominator is microseconds (a closed gate) are reported in absolute terms with their range instead.
The train, decode and peers sections run on real footage (Debian's media packages, benchmarks/footage.py).
The `peers` section runs Grain, DALI, MosaicML Streaming, LitData and LeRobot in virtualenvs it creates once
(see benchmarks/peers/venvs.py); ``EPBENCH_PEERS=grain,dali`` runs some of them only. Every table records the
commit it was produced at.

    python scripts/bench.py                 # all sections
    python scripts/bench.py gate decode     # some sections
    python scripts/bench.py --quick         # smaller data, for a smoke run
    python scripts/bench.py --note "..."    # a line under the title (e.g. "measured under load")
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import shlex
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SECTIONS = ["shard", "gate", "decode", "len", "index", "train", "mixture", "lerobot", "peers", "codec", "remote",
            "scale", "reference"]


def _commit() -> str:
    """``git rev-parse --short HEAD``, plus ``-dirty`` when the code differs from it: the code measured."""
    import subprocess

    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        # untracked files count where the measured code lives (a new benchmark module), not elsewhere
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "episodepipes", "benchmarks", "scripts",
                                "pyproject.toml"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("-dirty" if dirty else "")


def _machine() -> dict:
    import cv2
    import numpy
    import torch
    import torchdata
    import webdataset

    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = {"python": platform.python_version(), "torch": torch.__version__,
                "torchdata": torchdata.__version__, "webdataset": getattr(webdataset, "__version__", "?"),
                "opencv": cv2.__version__, "numpy": numpy.__version__}
    for name in ("lightning", "av", "PIL", "episodepipes"):
        try:
            versions[name] = importlib.import_module(name).__version__
        except (ImportError, AttributeError):
            pass
    return {"cpu": cpu, "cores": os.cpu_count(), "platform": platform.platform(), "versions": versions}


def _fmt(x: float | None) -> str:
    if x is None:
        return "–"
    if x == 0:
        return "0"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    if abs(x) >= 1:
        return f"{x:.2f}"
    return f"{x:.3g}"


def _ratio(a: float | None, b: float | None, unit: str) -> str:
    if a is None or b is None or a == 0 or b == 0:
        return "–"
    # For throughput (x/s) higher is better: ours/ref. For costs (s, ms, µs, bytes, frames) ref/ours.
    r = a / b if "/s" in unit else b / a
    return f"{r:,.2f}x" if r < 100 else f"{r:,.0f}x"


def _table(result: dict) -> list[str]:
    lines = ["| metric | ours | baseline | ceiling | unit | vs baseline | vs ceiling | note |",
             "|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        ours, base, ceil, unit = r.get("ours"), r.get("baseline"), r.get("ceiling"), r.get("unit", "")
        lines.append(f"| {r['metric']} | {_fmt(ours)} | {_fmt(base)} | {_fmt(ceil)} | {unit} | "
                     f"{_ratio(ours, base, unit)} | {_ratio(ours, ceil, unit)} | {r.get('note', '')} |")
    return lines


def _extra_tables(result: dict) -> list[str]:
    """A section's own tables (``{"title", "columns", "rows"}``), for figures that are not ours-vs-reference."""
    lines: list[str] = []
    for t in result.get("tables", []):
        lines += [f"**{t['title']}**", "", "| " + " | ".join(t["columns"]) + " |",
                  "|" + "---|" * len(t["columns"])]
        lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in t["rows"]]
        lines.append("")
    return lines


def _plots(results: dict[str, dict], out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    fps_rows = [(f"{s}: {r['metric']}", r) for s, res in results.items() for r in res["rows"]
                if r.get("unit") == "frames/s" and r.get("ours") and r.get("ceiling")]
    if fps_rows:
        # Fractions of the ceiling measured in the same run: absolute frames/s differ by frame size.
        fig, ax = plt.subplots(figsize=(10, 0.5 * len(fps_rows) + 1.5))
        y = list(range(len(fps_rows)))
        ours = [r["ours"] / r["ceiling"] for _, r in fps_rows]
        base = [(r.get("baseline") or 0) / r["ceiling"] for _, r in fps_rows]
        ax.barh([i + 0.2 for i in y], ours, 0.4, label="episodepipes")
        ax.barh([i - 0.2 for i in y], base, 0.4, label="baseline a user would write")
        for i, (_, r) in enumerate(fps_rows):
            ax.text(ours[i] + 0.01, i + 0.2, f"{r['ours']:,.0f}/s", va="center", fontsize=7)
        ax.axvline(1.0, color="k", lw=1, ls="--", label="ceiling (same run)")
        ax.set_yticks(y, [n for n, _ in fps_rows], fontsize=8)
        ax.set_xlabel("frames/s as a fraction of the ceiling (higher is better)")
        ax.legend(fontsize=8, loc="lower right")
        fig.tight_layout()
        fig.savefig(out / "bench_fps.png", dpi=110)
        made.append("bench_fps.png")
    gate = (results.get("gate") or {}).get("series") or {}
    loaders = [(k, v) for k, v in gate.items() if "median_ms" in v]
    if loaders:
        fig, ax = plt.subplots(figsize=(8, 3.2))
        med = [v["median_ms"] for _, v in loaders]
        err = [[m - v["min_ms"] for m, (_, v) in zip(med, loaders)],
               [v["max_ms"] - m for m, (_, v) in zip(med, loaders)]]
        ax.bar(range(len(loaders)), med, 0.6, yerr=err, capsize=3)
        ax.set_yscale("log")
        ax.set_xticks(range(len(loaders)), [k[:3] for k, _ in loaders])
        ax.set_ylabel("ms per closed pass (log; median, range)")
        ax.set_title("closed validation pass: (a)-(d) DataLoader variants, (e) episodepipes", fontsize=9)
        fig.tight_layout()
        fig.savefig(out / "bench_gate.png", dpi=110)
        made.append("bench_gate.png")
    series = (results.get("len") or {}).get("series") or {}
    xs, ys = series.get("episodes"), series.get("len_us") or series.get("seconds")
    if xs and ys:
        fig, ax = plt.subplots(figsize=(6, 3))
        ax.plot(xs, ys, "o-")
        ax.set_xscale("log")
        ax.set_ylim(0, max(ys) * 1.5)  # from zero, so flat looks flat
        ax.set_xlabel("episodes in the index")
        ax.set_ylabel("len() time (µs)" if series.get("len_us") else "len() time (s)")
        fig.tight_layout()
        fig.savefig(out / "bench_len.png", dpi=110)
        made.append("bench_len.png")
    if "index" in results:
        from benchmarks.bench_index import plot

        plot(results["index"], out / "bench_index.png")
        made.append("bench_index.png")
    if "scale" in results:
        from benchmarks.bench_scale import plot as plot_scale

        plot_scale(results["scale"], out / "bench_scale.png")
        made.append("bench_scale.png")
    return made



def _with_previous(results: dict[str, dict], path: Path) -> dict[str, dict]:
    """``results`` plus the sections of an earlier run's ``benchmarks.json`` that this run did not re-run.

    A file written before sections carried their own commit gives its file-level commit, command, note and machine
    to each of its sections. The sections come out in `SECTIONS` order.
    """
    try:
        prev = json.loads(path.read_text())
    except (OSError, ValueError):
        prev = {}
    kept = {}
    for name, res in (prev.get("results") or {}).items():
        if name in SECTIONS and name not in results and isinstance(res, dict):
            for key in ("commit", "command", "note", "machine"):
                res.setdefault(key, prev.get(key))
            kept[name] = res
    merged = {**kept, **results}
    return {name: merged[name] for name in SECTIONS if name in merged}


def write_docs(results: dict[str, dict], out: Path, *, commit: str, command: str, note: str = "",
               quick: bool = False) -> None:
    """Write BENCHMARKS.md, benchmarks.json and the plots for ``results`` (plus earlier sections kept)."""
    out.mkdir(parents=True, exist_ok=True)
    machine = _machine()
    for res in results.values():
        res.update(commit=commit, command=command, note=note, machine=machine)
    if not quick:  # a partial run replaces its own sections and keeps the others, each with its own commit
        results = _with_previous(results, out / "benchmarks.json")
    plots = _plots(results, out)
    md = ["# Benchmarks", "",
          "Each section was produced by the command, at the commit and on the machine written under its title: "
          "re-running some sections (`python scripts/bench.py train codec`) replaces those and keeps the others.",
          "", "Ratios: for throughput (frames/s) `ours / reference`; for costs (time, bytes, frames) "
          "`reference / ours`. Above 1x means episodepipes is better.", ""]
    for name, res in results.items():
        m = res.get("machine") or machine
        md += [f"## {name}", "", *(res.get("intro", "").splitlines()), "",
               f"Commit `{res.get('commit')}`; command `{res.get('command')}`"
               f"{' (quick mode: smoke figures)' if quick else ''}."
               + (f" **{res['note']}**" if res.get("note") else ""), "",
               f"Machine: {m['cpu']}, {m['cores']} cores, {m['platform']}; "
               + ", ".join(f"{k} {v}" for k, v in m["versions"].items()), "",
               *_extra_tables(res), *(_table(res) + [""] if res.get("rows") else [])]
        if res.get("versions"):
            md += ["Versions measured here: " + "; ".join(f"{k}: {v}" for k, v in res["versions"].items()), ""]
    md += [f"![{p}]({p})" for p in plots]
    (out / "BENCHMARKS.md").write_text("\n".join(md) + "\n")
    (out / "benchmarks.json").write_text(json.dumps({"results": results}, indent=1, default=str))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sections", nargs="*", choices=[[], *SECTIONS], default=[], metavar="SECTION",
                    help=f"any of {', '.join(SECTIONS)} (default: all)")
    ap.add_argument("--quick", action="store_true", help="small data; a smoke run, not figures to quote")
    ap.add_argument("--out", type=Path, default=ROOT / "docs", help="where BENCHMARKS.md and plots go")
    ap.add_argument("--workdir", type=Path, default=None, help="scratch folder (default: a temp dir)")
    ap.add_argument("--note", default="", help="a line written under the title, e.g. how loaded the machine was")
    args = ap.parse_args(argv)
    sections = args.sections or SECTIONS
    command = "python scripts/bench.py" + ("" if not argv else " " + shlex.join(argv))
    commit = _commit()  # before the run: what was measured, even if the tree changes meanwhile
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="epbench-") as tmp:
        work = args.workdir or Path(tmp)
        for k, name in enumerate(sections, 1):
            try:
                mod = importlib.import_module(f"benchmarks.bench_{name}")
            except ModuleNotFoundError as e:
                print(f"[{k}/{len(sections)}] {name}: not available ({e})", flush=True)
                continue
            print(f"[{k}/{len(sections)}] {name} ...", flush=True)
            t0 = time.perf_counter()
            (work / name).mkdir(parents=True, exist_ok=True)
            results[name] = mod.run(work / name, args.quick)
            if name == "train":  # the read lease's cost, on the section's footage (benchmarks/bench_lease.py)
                results[name]["rows"] += importlib.import_module("benchmarks.bench_lease").run(work / name,
                                                                                                 args.quick)["rows"]
            print(f"[{k}/{len(sections)}] {name} done in {time.perf_counter() - t0:.1f}s", flush=True)
            for line in _extra_tables(results[name]) + (_table(results[name]) if results[name].get("rows") else []):
                print("   ", line)
    write_docs(results, args.out, commit=commit, command=command, note=args.note, quick=args.quick)
    print(f"wrote {args.out / 'BENCHMARKS.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
