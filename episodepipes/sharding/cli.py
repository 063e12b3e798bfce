"""``episodepipes-shard`` (also ``scripts/shard.py``): episodes in, WebDataset shards and an index out.

Commands::

    write SRC OUT    shard a dataset (raw folders, zarr, lerobot); re-running an interrupted write resumes it
    info OUT         summary table of a finished output (frames and bytes per split, each camera's codec);
                     --episodes lists them, --json prints it all as JSON
    verify OUT       check every shard's sha256, every frame's crc32, and that every frame is where the index says
    stats OUT        normalization statistics per split and array key (--recompute: for older indexes;
                     --json: every element, as JSON)
    show OUT [EPISODE ...]
                     write one self-contained HTML page: the episodes' videos in sync with plots of their
                     arrays, their attributes, the dataset's splits, lengths and statistics (--serve: on 127.0.0.1)
    merge OUT        join the outputs of `write --num-jobs K --job-index I` (I = 0..K-1) into OUT
    sbatch SRC OUT   print a Slurm batch script: a K-task array of `write`, then `merge` as an afterok job
    upgrade OUT      rewrite a version-1 index as version 2 in place, reading no shard (--crc: read them to
                     add every frame's crc32)

Multi-job runs: job I shards the I-th contiguous block of the sorted episode list into
``OUT/_jobs/job-IIII/``. ``merge`` renames the jobs' shards into OUT (no byte copied; the same episodes and
frames as a single-job ``write``, shards cut where each job cut them); ``merge --repack`` re-packs the encoded
samples (a byte copy, no re-encoding), so the merged OUT is byte-identical to a single-job ``write`` with the
same options: same shard files, same sha256, same ``index.json``. Under a Slurm job array ``write --num-jobs K``
takes its job index from ``SLURM_ARRAY_TASK_ID`` (`episodepipes.sharding.slurm`).

One writer per output: ``write`` and ``merge`` hold ``OUT/_write.lock`` (a job, its job folder's),
which names the writer's pid and host; a second writer is refused, and a lock left by a dead
process on this host is taken over with a warning. A full disk stops the run with everything
finished kept: free space and re-run to resume.

Splits: a split given by an episode's own metadata (``"split"`` in meta.json, zarr attrs) wins
over ``--val-fraction``, which assigns only the episodes without one; ``--val-episodes`` overrides
every episode. The summary says how many splits came from where.

Custom layouts: ``--format module:factory`` or an installed ``episodepipes.formats`` entry point
(see `episodepipes.sharding.formats.readers`). On a terminal progress is a bar; in a log (stderr not a
terminal) a line every 10 s. The run ends with a summary: counts, wall time, frames/s.

Input errors exit with status 2 and one line naming the file or episode and the fix; a failed
``verify`` exits with status 1; output into a closed pipe (``info OUT | head``) ends quietly with 141.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
from pathlib import Path
from typing import TextIO

from episodepipes.codec.copy import MAX_GOP
from episodepipes.errors import WorkerError
from episodepipes.index import EpisodeIndex
from episodepipes.remote.retry import printable
from episodepipes.sharding.episode import EpisodeError
from episodepipes.sharding.ray_jobs import finished_job
from episodepipes.sharding.slurm import array_task, job_index, submit_script
from episodepipes.sharding.write import DiskFullError, WriteResult
from episodepipes.sharding.write.plan import parse_resize, parse_size
from episodepipes.sharding.write.saves import SAVE_EVERY
from episodepipes.shardio import ShardIOError, is_url

PROG = "episodepipes-shard"


def _format_help() -> str:
    from episodepipes.sharding.formats.readers import FORMATS, plugin_formats

    names = ", ".join([*FORMATS, *plugin_formats()])
    return (f"auto (detect), {names}, or module:factory (import module, call factory(SRC) -> EpisodeReader, "
            "or a Format; the module must be importable, e.g. on PYTHONPATH, in every job)")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    sub = p.add_subparsers(dest="command", required=True)
    w = sub.add_parser("write", help="shard SRC into OUT (resumes an interrupted run with the same options)")
    w.add_argument("src", type=Path, metavar="SRC",
                   help="the source dataset's folder: raw episode folders, a zarr store or a LeRobot dataset "
                        "(--format says which; auto detects)")
    w.add_argument("out", type=_root, metavar="OUT", help="a folder, or s3://bucket/prefix or gs://bucket/prefix "
                   "(shards uploaded as they finish, the index last; credentials from the standard environment)")
    w.add_argument("--staging", type=Path, default=None, metavar="DIR",
                   help="remote OUT: local folder to stage shards in, about one shard of disk (default "
                        "~/.cache/episodepipes/staging); a resume reads the remote progress, any DIR will do")
    w.add_argument("--format", default="auto", help=_format_help())
    w.add_argument("--shard-size", default="512MB", help="target shard size, e.g. 512MB, 1GiB (default 512MB)")
    w.add_argument("--jpeg-quality", type=int, default=90, help="JPEG quality 1-100 (default 90)")
    w.add_argument("--resize", default=None, metavar="HxW", help="resize every frame to height x width")
    w.add_argument("--codec", default="jpeg", choices=("jpeg", "h264", "av1", "copy", "reference"),
                   help="frames as JPEG (default), or h264/AV1 packets in GOPs of --gop frames, or copy: the "
                        "source's own video packets, not decoded (lerobot, and raw <camera>.mp4; a GOP up to "
                        f"{MAX_GOP} frames, no B-frames; cameras without video, LeRobot image features and PNG "
                        "folders, are stored as JPEG at --jpeg-quality; zarr has no video and is refused); "
                        "reference (lerobot, raw <camera>.mp4): no frames written, OUT indexes the packets in "
                        "SRC's own mp4s, read from SRC at open (EpisodeIndex.open(OUT, source_root=SRC))")
    w.add_argument("--gop", type=int, default=None,
                   help="h264/av1: frames per keyframe, 1..1000 (default 2); copy keeps the source's")
    w.add_argument("--crf", type=int, default=None,
                   help="h264/av1: quality, lower is better (h264 0..51, default 18; av1 0..63, default 30)")
    w.add_argument("--fast-decode", action="store_true",
                   help="h264 only: x264's fastdecode tune (CAVLC, no deblocking): a few %% more bytes, cheaper "
                        "decodes; with --gop 2 the setting for sparse reads and training windows")
    split = w.add_mutually_exclusive_group()
    split.add_argument("--val-fraction", type=float, default=None, metavar="F",
                       help="for episodes whose metadata gives no split: val if among round(F * episodes) "
                            "chosen with --seed, else train (a split in meta.json or the dataset wins)")
    split.add_argument("--val-episodes", nargs="+", default=None, metavar="ID",
                       help="these episodes are val, every other one train (overrides the metadata's split)")
    w.add_argument("--seed", type=int, default=0, help="seed of the --val-fraction choice (default 0)")
    w.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1),
                   help="encoder processes (default: cores, at most 8); the output does not depend on it")
    w.add_argument("--skip-bad", action="store_true", help="skip unreadable episodes and list them at the end")
    w.add_argument("--overwrite", action="store_true", help="replace a finished or unfinished output")
    w.add_argument("--num-jobs", type=int, default=1, metavar="K", help="split the episodes over K jobs")
    w.add_argument("--job-index", type=int, default=None, metavar="I",
                   help="this job's index, 0..K-1 (default: from SLURM_ARRAY_TASK_ID under a Slurm array "
                        "of K tasks, else 0)")
    w.add_argument("--save-every", type=float, default=SAVE_EVERY, metavar="SECONDS",
                   help=f"seconds between two resume saves (default {SAVE_EVERY:g}; 0: after every shard); the "
                        "progress is saved when the write ends, fails or is interrupted too, so only a kill -9 or a "
                        "power cut costs the shards of the last SECONDS, which a resume writes again")
    w.add_argument("--tolerance-s", type=float, default=None, metavar="S",
                   help="lerobot only: how far (seconds) a row's timestamp may lie from its video frame before "
                        "the episode is refused; finite, > 0 (default 1e-4, LeRobot's)")
    for name, text in (("info", "print a summary table"), ("verify", "check sha256, crc32 and frame offsets")):
        c = sub.add_parser(name, help=text)
        c.add_argument("out", type=_root, metavar="OUT", help="a shard folder, or a remote root (s3://bucket/prefix, "
                       "gs://..., https://...) read with the standard environment (AWS_ENDPOINT_URL, ...)")
    sub.choices["verify"].add_argument("--source-root", default=None, metavar="SRC",
                                       help="an index written with --codec reference: the dataset root its frames "
                                            "are read from (default: the folder it was written in, if inside SRC)")
    for c in (sub.choices["verify"], st := sub.add_parser("stats", help="print the normalization statistics per "
                                                                        "split and array key")):
        if c is st:
            st.add_argument("out", type=Path, metavar="OUT", help="a local shard folder (the OUT of write)")
        c.add_argument("--num-jobs", type=int, default=None, metavar="K",
                       help="split the work over K jobs (verify: shards; stats --recompute: episodes); each leaves "
                            "its part in OUT/_parts, and --merge lists or folds them")
        c.add_argument("--job-index", type=int, default=None, metavar="I",
                       help="this job's part, 0..K-1 (default: from SLURM_ARRAY_TASK_ID under a Slurm array)")
        c.add_argument("--merge", action="store_true", help="with --num-jobs K: merge the K parts (after them)")
    info = sub.choices["info"]
    info.add_argument("--episodes", action="store_true", help="also list every episode: id, split, length, task")
    info.add_argument("--json", action="store_true",
                      help="print one JSON object (sorted keys; the dataset's text as JSON strings) for scripts")
    u = sub.add_parser("upgrade", help="rewrite a version-1 index as version 2 in place (reads no shard)")
    u.add_argument("out", type=Path, metavar="OUT", help="a local shard folder whose index.json is version 1")
    u.add_argument("--crc", action="store_true",
                   help="also read every shard (its sha256 checked first) to add each frame's crc32")
    st.add_argument("--recompute", action="store_true",
                    help="read the arrays from the shards and rewrite the index with statistics (older indexes)")
    st.add_argument("--json", action="store_true",
                    help="print one JSON object, {split: {key: {count, shape, mean, std, min, max, q01..q99}}}, "
                         "every element (a non-finite one as null), sorted keys")
    from episodepipes.sharding.show.cli import add_parser as add_show

    add_show(sub, _root)
    sb = sub.add_parser("sbatch", help="print a bash script submitting write as a Slurm array of K tasks, then "
                                       "merge as an afterok job: bash it, or edit it first")
    _fleet_args(sb)
    sb.add_argument("--sbatch-option", action="append", default=[], metavar="OPT",
                    help="an sbatch option for both submissions, e.g. --sbatch-option=--partition=cpu (repeat)")
    sb.add_argument("--python", default=None, help="the interpreter the jobs run (default: this one)")
    r = sub.add_parser("ray", help="run write as K Ray tasks on an existing Ray cluster, then merge (pip install "
                                   "episodepipes[ray])")
    _fleet_args(r)
    r.add_argument("--address", default="auto", help="the Ray cluster: auto (RAY_ADDRESS or a local head), or "
                                                     "host:port / ray://host:port (default auto)")
    r.add_argument("--cpus-per-job", type=float, default=1.0, help="CPUs Ray reserves per write task (default 1; "
                                                                   "match --workers in the write options)")
    m = sub.add_parser("merge", help="join the outputs of --num-jobs K into OUT: the jobs' shards renamed in place "
                                     "(no byte copied), or with --repack byte-identical to one job")
    m.add_argument("out", type=_root, metavar="OUT", help="the OUT of the jobs: a folder or a remote root")
    m.add_argument("--overwrite", action="store_true", help="merge again over a merged output")
    m.add_argument("--repack", action="store_true",
                   help="copy every frame into the shard cuts of a single-job write (byte-identical to one job; "
                        "reads and writes every byte); a remote OUT is always repacked")
    m.add_argument("--staging", type=Path, default=None, metavar="DIR", help="remote OUT: as for write")
    return p


def _fleet_args(p: argparse.ArgumentParser) -> None:
    """SRC OUT --num-jobs K [--repack] -- WRITE OPTIONS: what `sbatch` and `ray` run as K write jobs and a merge."""
    p.add_argument("src", metavar="SRC", help="the source dataset, as every job sees it")
    p.add_argument("out", metavar="OUT", help="the output folder, shared by every job")
    p.add_argument("--num-jobs", type=int, required=True, metavar="K", help="write jobs (the array's size)")
    p.add_argument("--repack", action="store_true", help="merge with --repack (byte-identical to one job)")
    p.set_defaults(write_args=[])  # the words after ``--``: further write options, split off by `main`
    p.epilog = "Further write options go after --, e.g.: -- --shard-size 1GB --workers 4"


def _fleet_write_args(a: argparse.Namespace) -> list[str]:
    """The write options after ``--``, checked now by the write parser (a typo fails here, not in K jobs)."""
    rest = a.write_args
    if a.num_jobs < 1:
        raise ValueError(f"--num-jobs {a.num_jobs} must be >= 1")
    for word in ("--num-jobs", "--job-index"):
        if any(w == word or w.startswith(word + "=") for w in rest):
            raise ValueError(f"{word} is set by the {a.command} command itself; drop it from the write options")
    parsed = _parser().parse_args(["write", a.src, a.out, *rest, "--num-jobs", str(a.num_jobs), "--job-index", "0"])
    _check_write_args(parsed)
    return rest


def _root(text: str) -> Path | str:
    """A remote root stays a URL (a `Path` would fold its ``//``); anything else is a folder."""
    return text if is_url(text) else Path(text)


def _check_write_args(a: argparse.Namespace) -> None:
    if not 1 <= a.jpeg_quality <= 100:
        raise ValueError(f"--jpeg-quality {a.jpeg_quality} must be within 1..100")
    if a.fast_decode and a.codec != "h264":
        raise ValueError(f"--fast-decode is x264's fastdecode tune and applies to --codec h264 only, not --codec "
                         f"{a.codec}; drop it, or use --codec h264")
    if a.codec in ("copy", "reference"):
        for flag, value in (("--gop", a.gop), ("--crf", a.crf), ("--resize", a.resize)):
            if value is not None:
                raise ValueError(f"{flag} {value} does not apply to --codec {a.codec}, which keeps the source's "
                                 "packets (their GOPs, quality and size); drop it, or use --codec av1 to re-encode")
    elif a.codec != "jpeg":
        from episodepipes.codec import CodecOptions

        gop = 2 if a.gop is None else a.gop
        # its ValueError names the option and its range
        CodecOptions(codec=a.codec, gop=gop, crf=a.crf, fast_decode=a.fast_decode)
    most = 4 * (os.cpu_count() or 1)
    if not 1 <= a.workers <= most:  # encoding is CPU-bound: more processes only cost memory
        raise ValueError(f"--workers {a.workers} must be within 1..{most} (4 per core)")
    if a.num_jobs < 1:
        raise ValueError(f"--num-jobs {a.num_jobs} must be >= 1")
    if not 0 <= a.job_index < a.num_jobs:
        raise ValueError(f"--job-index {a.job_index} must be within 0..{a.num_jobs - 1} for --num-jobs {a.num_jobs}")
    if a.seed < 0:
        raise ValueError(f"--seed {a.seed} must be >= 0")
    if a.val_fraction is not None and not 0.0 <= a.val_fraction <= 1.0:  # also refuses nan
        raise ValueError(f"--val-fraction {a.val_fraction} must be within 0..1")
    if not math.isfinite(a.save_every) or a.save_every < 0:
        raise ValueError(f"--save-every {a.save_every} must be a finite number of seconds >= 0 (0: after every shard)")


def _summary(a: argparse.Namespace, res: WriteResult) -> list[str]:
    rate = res.frames_written / max(res.seconds, 1e-9)
    lines = [f"{'resumed and wrote' if res.resumed else 'wrote'} {res.episodes} episodes, {res.frames} frames, "
             f"{res.shards} shards to {res.out} in {res.seconds:.2f} s ({rate:.0f} frames/s this run); "
             f"skipped {len(res.skipped)} bad episodes"]
    option = "--val-episodes" if a.val_episodes is not None else "--val-fraction"
    names = {"metadata": "from the episodes' metadata", "option": f"from {option}", "default": "train by default"}
    lines.append("splits: " + ", ".join(f"{res.split_origins.get(k, 0)} {v}" for k, v in names.items()))
    lines += [f"skipped {s['id']}: {s['error']}" for s in res.skipped]
    if a.num_jobs > 1:
        lines.append(f"job {a.job_index} of {a.num_jobs} done; when all jobs are done run: {PROG} merge {a.out}")
    return lines


def _write(a: argparse.Namespace) -> int:
    from episodepipes.sharding.formats.readers import FORMATS, resolve
    from episodepipes.sharding.write import WriteOptions, write_shards
    from episodepipes.sharding.write.encoders import start_early

    from_array = a.job_index is None and array_task(os.environ) is not None
    a.job_index = job_index(a.num_jobs, a.job_index, os.environ)
    _check_write_args(a)
    if from_array and a.num_jobs > 1 and not a.overwrite and not is_url(a.out) and finished_job(a.out, a.job_index):
        _say(f"job {a.job_index} of {a.num_jobs} already finished ({a.out}); nothing to do")  # a re-submitted array
        return 0
    if a.staging is not None and not is_url(a.out):
        raise ValueError(f"--staging applies to a remote OUT (s3://, gs://) only, and {a.out} is a folder; drop it")
    root, fmt = resolve(a.src, a.format)
    opts = WriteOptions(format=fmt, shard_size=parse_size(a.shard_size), jpeg_quality=a.jpeg_quality,
                        resize=parse_resize(a.resize), val_fraction=a.val_fraction,
                        val_episodes=tuple(a.val_episodes) if a.val_episodes is not None else None,
                        seed=a.seed, skip_bad=a.skip_bad, codec=a.codec, gop=2 if a.gop is None else a.gop,
                        crf=a.crf, fast_decode=a.fast_decode)
    if a.tolerance_s is not None and fmt != "lerobot":
        raise ValueError(f"--tolerance-s applies to LeRobot datasets only, and {root} is {fmt}; drop the option")
    if a.codec == "copy" and not FORMATS[fmt].copies:
        raise ValueError(f"--codec copy takes the video packets of lerobot and raw (<camera>.mp4) sources, and {root} "
                         f"is {fmt}, whose frames are not stored as video; use --codec av1 or --codec h264")
    options = {} if a.tolerance_s is None else {"tolerance_s": a.tolerance_s}
    if a.codec == "reference":
        return _reference(a, root, fmt, opts, options)
    start_early(a.workers, a.codec, FORMATS[fmt].factory.__module__)  # the encoders' fork server starts meanwhile
    reader = FORMATS[fmt].factory(root, **options, **({"copy": True} if a.codec == "copy" else {}))
    res = write_shards(reader, a.out, opts, workers=a.workers, num_jobs=a.num_jobs,
                       job_index=a.job_index, overwrite=a.overwrite, progress_bar=True, staging=a.staging,
                       save_every=a.save_every)
    _say(_summary(a, res))
    return 0


def _reference(a: argparse.Namespace, root: Path, fmt: str, opts: object, options: dict) -> int:
    """``write --codec reference``: an index of SRC's own files (`episodepipes.sharding.formats.lerobot_ref`)."""
    from episodepipes.sharding.formats import lerobot_ref, raw_ref

    if fmt not in ("lerobot", "raw") or is_url(a.out):
        raise ValueError(f"--codec reference indexes a local LeRobot dataset or raw <camera>.mp4 folders into a local "
                         f"OUT, and {root} is {fmt} (OUT {a.out}); use --codec copy")
    index = lerobot_ref.index_lerobot if fmt == "lerobot" else raw_ref.index_raw
    res = index(root, a.out, **options, shard_size=opts.shard_size,  # type: ignore[attr-defined, operator]
                val_fraction=a.val_fraction, overwrite=a.overwrite, seed=a.seed,
                val_episodes=tuple(a.val_episodes) if a.val_episodes is not None else None)
    _say(lerobot_ref.summary(res))
    return 0


class StdoutClosed(Exception):
    """The reader of the output went away (``info | head``): not an error of OUT's."""


def _say(lines: str | list[str], *, file: TextIO | None = None) -> None:
    """Print ``lines`` (a string's lines, or a list of them) with no character that acts on a terminal: they
    quote a dataset's own text (ids, splits, prompts, attributes, errors), which anyone may have written.
    Flushed at once, so a closed pipe is met here (`StdoutClosed`), not in another command's OSError handler."""
    rows = lines.split("\n") if isinstance(lines, str) else lines
    out = sys.stdout if file is None else file
    try:
        print("\n".join(printable(r) for r in rows), file=out, flush=True)
    except BrokenPipeError:
        raise StdoutClosed from None


def _json(data: object) -> str:
    """Sorted keys, two-space indent; ASCII only: JSON escapes every control or non-ASCII character itself, so a
    dataset's text reaches a terminal or a script as it is, and acts on neither."""
    return json.dumps(data, sort_keys=True, indent=2)


def _table(rows: list[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def _run(a: argparse.Namespace) -> int:
    from episodepipes.sharding import inspect

    if a.command == "write":
        return _write(a)
    if a.command == "sbatch":
        _say(submit_script(a.src, a.out, a.num_jobs, _fleet_write_args(a), sbatch_args=a.sbatch_option,
                           merge_args=["--repack"] if a.repack else [], python=a.python).rstrip("\n"))
        return 0
    if a.command == "ray":
        from episodepipes.sharding.ray_jobs import run_jobs

        merged = run_jobs(a.src, a.out, a.num_jobs, _fleet_write_args(a), address=a.address,
                          cpus_per_job=a.cpus_per_job, repack=a.repack,
                          progress=lambda line: _say(line, file=sys.stderr))
        episodes = merged["columns"]["episodes"]["shape"][0]  # the ids are a column now, not in the JSON
        _say(f"merged {a.num_jobs} Ray jobs into {a.out}: {episodes} episodes, {len(merged['shards'])} shards")
        return 0
    if a.command == "info":
        index = EpisodeIndex.open(a.out)
        if a.json:
            data = {"output": str(a.out), **inspect.summary(index)}
            if a.episodes:
                data["episode_list"] = inspect.episode_data(index)
            _say(_json(data))
            return 0
        _say(_table([("output", str(a.out)), *inspect.summarize(index)]))
        if a.episodes:
            rows = inspect.episode_rows(index)  # the last column (the task) is free text: not padded
            widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]) - 1)]
            _say(["  ".join(f"{v:<{w}}" for v, w in zip(r, widths)) + "  " + r[-1] for r in rows])
        return 0
    if a.command == "upgrade":
        from episodepipes.sharding.upgrade import upgrade

        index = upgrade(a.out, crc=a.crc)
        _say(f"upgraded {a.out} to index version 2: {len(index.episodes)} episodes, {index.frames} frames, "
              f"{'crc32 per frame' if index.has_crc else 'no crc32 (upgrade --crc adds them)'}")
        return 0
    if a.command in ("verify", "stats") and (a.num_jobs is not None or a.merge or a.job_index is not None):
        return _split(a)
    if a.command == "stats":
        from episodepipes.sharding.stats_cli import run

        shown = run(a.out, recompute=a.recompute, as_json=a.json)
        _say(_json(shown) if a.json else shown)
        return 0
    if a.command == "show":
        from episodepipes.sharding.show.cli import run

        return run(a, _say)
    if a.command == "verify":
        problems = inspect.verify(a.out, source_root=a.source_root)
        if problems:
            _say(problems, file=sys.stderr)
        _say(f"{a.out}: {'FAILED, ' + str(len(problems)) + ' problems' if problems else 'ok'}")
        return 1 if problems else 0
    from episodepipes.sharding.merge import merge_jobs

    merge_jobs(a.out, overwrite=a.overwrite, staging=a.staging, repack=a.repack)
    index = EpisodeIndex.open(a.out)
    _say(f"merged into {a.out}: {len(index.episodes)} episodes, {len(index.shards)} shards")
    return 0


def _split(a: argparse.Namespace) -> int:
    """``verify``/``stats --recompute`` as job I of K, or ``--merge`` of their K parts (`sharding.parts`)."""
    from episodepipes.sharding import parts

    if a.num_jobs is None or a.num_jobs < 1:
        raise ValueError(f"--job-index and --merge need --num-jobs K (K >= 1); got --num-jobs {a.num_jobs}")
    if a.command == "stats" and not a.recompute:
        raise ValueError("--num-jobs splits stats --recompute only; add --recompute, or drop --num-jobs to print")
    if is_url(a.out):
        raise ValueError(f"--num-jobs needs a local OUT, and {a.out} is remote; verify it whole")
    if a.merge:
        if a.command == "stats":
            parts.stats_merged(a.out, a.num_jobs)
            _say(f"{a.out}: statistics of {a.num_jobs} parts merged into the index")
            return 0
        problems = parts.verify_merged(a.out, a.num_jobs)
        if problems:
            _say(problems, file=sys.stderr)
        _say(f"{a.out}: {'FAILED, ' + str(len(problems)) + ' problems' if problems else 'ok'} ({a.num_jobs} parts)")
        return 1 if problems else 0
    i = job_index(a.num_jobs, a.job_index, os.environ)
    if not 0 <= i < a.num_jobs:
        raise ValueError(f"--job-index {i} must be within 0..{a.num_jobs - 1} for --num-jobs {a.num_jobs}")
    if a.command == "stats":
        parts.stats_part(a.out, a.num_jobs, i)
        _say(f"{a.out}: statistics part {i} of {a.num_jobs} done; after all: {PROG} stats {a.out} --recompute "
             f"--num-jobs {a.num_jobs} --merge")
        return 0
    problems = parts.verify_part(a.out, a.num_jobs, i)
    if problems:
        _say(problems, file=sys.stderr)
    _say(f"{a.out}: part {i} of {a.num_jobs} {'FAILED, ' + str(len(problems)) + ' problems' if problems else 'ok'}")
    return 1 if problems else 0


class _Printable(logging.Formatter):
    """Log lines with no character that acts on a terminal: a warning may quote a dataset's names, a lock file's
    holder or a reader's error."""

    def format(self, record: logging.LogRecord) -> str:
        return "\n".join(printable(line) for line in super().format(record).split("\n"))


def _error(msg: str) -> None:
    """One line, even when the message quotes a library's multi-line error (OpenCV's, for one), with no character
    that acts on a terminal (a name or a server's words may carry escape sequences)."""
    print(f"{PROG}: error: {printable(' '.join(msg.split()))}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit status (0 ok, 1 verify failed, 2 input error)."""
    argv, rest = list(sys.argv[1:] if argv is None else argv), []
    if argv[:1] in (["sbatch"], ["ray"]) and "--" in argv:  # the write options of the jobs, passed on as words
        argv, rest = argv[:argv.index("--")], argv[argv.index("--") + 1:]
    a = _parser().parse_args(argv)
    if rest:
        a.write_args = rest
    handler = logging.StreamHandler()
    handler.setFormatter(_Printable("%(levelname)s: %(message)s"))
    logging.basicConfig(level=logging.INFO if a.verbose else logging.WARNING, handlers=[handler])
    try:
        return _run(a)
    except StdoutClosed:  # Python's recipe (library/signal.html#note-on-sigpipe): no message, no flush error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, as a shell reports a command that SIGPIPE ended (`yes | head`)
    except ImportError as e:  # a missing extra (remote: obstore) names its pip install; any other is a bug
        if "pip install" not in str(e):
            raise
        _error(str(e))
    except (EpisodeError, ValueError, FileNotFoundError, FileExistsError, PermissionError, DiskFullError,
            WorkerError) as e:  # WorkerError: an encoder process died (the message names the episodes in flight)
        _error(str(e))
    except ShardIOError as e:  # a remote object missing or unreadable after retries: the message names it
        _error(str(e))
    except OSError as e:  # e.g. OUT under a file: the message names the path
        _error(f"{e}; check that OUT is a writable folder with free space")
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; re-run the same command to resume", file=sys.stderr)
        return 130
    return 2


if __name__ == "__main__":
    sys.exit(main())
