"""Opening an index file: its bytes (from a local folder or a remote root), its JSON, its format and version, and
the checked tables of either version, before `EpisodeIndex` holds any of it.

Everything read here is input from strangers, so each step refuses what it cannot use with one line naming the
file and the fix. A v1 index (parsed whole, every offset checked at open) is told once per process to upgrade.
"""

from __future__ import annotations

import json
import logging
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from episodepipes.format import COLUMNS, FORMAT_NAME, INDEX_NAME, VERSIONS
from episodepipes.index import columns as indexcolumns
from episodepipes.index import idcols
from episodepipes.index import v2 as indexv2
from episodepipes.index.check import IndexFormatError, check_index
from episodepipes.shardio import ByteSource, ShardMissingError, ShardTooLargeError, open_regular, open_source

if TYPE_CHECKING:
    from episodepipes.remote import RemoteOptions

MAX_INDEX_BYTES = 1 << 34  # far above any index (a v1 index of 10**8 frames is a few GB); a sparse file is not read
log = logging.getLogger("episodepipes.index")  # the logger the v1 warning has always come from
_WARNED: set[str] = set()  # v1 index files already told to upgrade in this process
_TRACES = ("_progress.json", "_jobs", "_write.lock")  # an unfinished write's files (sharding.write names them)


def regular_file(path: Path, fix: str, error: type[ValueError] = IndexFormatError) -> None:
    """Refuse ``path`` unless it is a regular file (through links): a FIFO would block an open forever, and a
    device such as /dev/zero never ends. A missing file is left to the caller's open."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISREG(mode):
        raise error(f"{path} is not a regular file (a folder, FIFO or device in its place); {fix}")


def read_regular(path: Path, fix: str, *, limit: int | None = None,
                 error: type[ValueError] = IndexFormatError) -> bytes:
    """The bytes of the regular file ``path``, read to the size it had when opened. A FIFO, a device or a folder
    in its place, or a file of more than ``limit`` bytes (a sparse file costs no disk), is refused by ``error``
    naming it and ``fix``; a missing file raises FileNotFoundError."""
    fd, st = open_regular(path, fix, error)
    try:
        if limit is not None and st.st_size > limit:
            raise error(f"{path} holds {st.st_size} bytes, more than the {limit} expected; {fix}")
        size, chunks, n = st.st_size, [], 0
        while n < size:
            b = os.read(fd, min(size - n, 1 << 26))
            if not b:
                break
            chunks.append(b)
            n += len(b)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_local(path: str | os.PathLike) -> tuple[Path, Path, bytes]:
    """(root, index file, its bytes) of a shard folder or its ``index.json``; a missing index raises
    FileNotFoundError saying whether the folder is an unfinished write, holds no shards at all (a source
    dataset: shard it first), or does not exist."""
    p = Path(str(path).removeprefix("file://"))
    root, file = (p.parent, p) if p.suffix == ".json" else (p, p / INDEX_NAME)
    if not file.exists():
        if not root.is_dir():
            hint = "the folder does not exist; check the path"
        elif any((root / name).exists() for name in _TRACES):
            hint = "an unfinished write: re-run the same write command to resume it"
        else:  # no trace of a write: most likely the source dataset itself (raw, zarr, LeRobot)
            hint = (f"the folder holds no shards index (a source dataset?); shard it first with: "
                    f"episodepipes-shard write {root} OUT, and open OUT")
        raise FileNotFoundError(f"no {INDEX_NAME} in {root}: {hint}")
    return root, file, read_regular(file, "restore the index or re-shard", limit=MAX_INDEX_BYTES)


def read_remote(url: str, options: RemoteOptions | None) -> tuple[ByteSource, str, bytes]:
    """(byte source, index URL, its bytes) of a remote root; a missing index raises FileNotFoundError."""
    source = open_source(url, options=options)  # refuses a root with credentials without echoing it
    file = f"{source.root}/{INDEX_NAME}"
    try:
        raw = source.read_file(INDEX_NAME, limit=MAX_INDEX_BYTES)  # refused by its size before the download
    except ShardMissingError:
        raise FileNotFoundError(f"no {INDEX_NAME} at {source.root}: an unfinished upload or write, or the "
                                "wrong prefix; check the URL") from None
    except ShardTooLargeError as e:
        raise IndexFormatError(str(e)) from None
    return source, file, raw


def tables(root: Path | str, data: Any, file: Path | str,
           source: ByteSource | None) -> tuple[int, dict, dict | None, dict[str, np.ndarray], np.ndarray, list[dict]]:
    """(version, the v2 metadata, the v1 JSON or None, the columns, which segments' frames are checked, the distinct
    attribute sets the ``attr`` column codes) of a parsed index, every field checked before it is returned; ``file``
    is what the messages name. The columns always hold the id columns (`episodepipes.index.idcols`): mapped when the
    index has them, else built from its JSON lists."""
    version = version_of(data, file)
    if version == 1:
        offsets, crcs = check_index(data, file)
        rest = {k: v for k, v in data.items() if k not in ("format", "version", "options", "shards", "episodes")}
        meta, cols = indexv2.build(data["shards"], data["episodes"], data.get("options", {}), rest,
                                   offsets=offsets, crcs=crcs)
        attrs, idc = idcols.from_json(meta)
        cols.update(idc)
        check_steps(meta, cols, file)
        seg_ok = np.ones(len(cols["segments"]), bool)  # v1 checks every offset at open
        warn_v1(file, root)
        return version, meta, data, cols, seg_ok, attrs
    w, sizes, samples = indexv2.check_meta(data, file)
    for name in data["columns"] if source is None else ():  # np.load would block on a FIFO, read a device forever
        regular_file(Path(root) / COLUMNS[name][0], "restore it or re-shard")
    cols = (indexcolumns.load_columns(root, data, file) if source is None
            else indexcolumns.read_columns(source, data, file))
    if indexv2.frames_apart(data):  # an in-place index's per-frame columns, from its own file
        from episodepipes.index.referenced import frame_columns

        cols.update(frame_columns(data, root, source, file))
    if "ids" in data:  # written before the id columns
        attrs, idc = idcols.from_json(data)
        cols.update(idc)
        warn_listed_ids(file, root)
    else:
        attrs = data["attrs"]
        indexv2.check_attrs(w, cols, attrs)
    indexv2.check_tables(w, data, cols, sizes, samples)
    indexcolumns.advise([cols[n] for n in indexcolumns.PER_FRAME if n in cols], "random")  # after the checks' scans
    return version, data, None, cols, np.zeros(len(cols["segments"]), bool), attrs


def check_steps(meta: dict, cols: dict[str, np.ndarray], file: Path | str) -> None:
    """Refuse a frame smaller than one step of its episode's arrays (v1, every frame at open; v2 checks it per
    segment on first use): the pipes allocate a step from the schema alone, so a crafted shape would cost any memory."""
    ep = cols["episodes"]
    least = np.array([indexv2.step_bytes(sc) for sc in meta["schemas"]], np.int64)[ep[:, indexv2.SCHEMA]]
    small = cols["size"] < np.repeat(least, ep[:, indexv2.LENGTH].astype(np.int64))
    if small.any():
        row = int(np.argmax(small))
        n = int(np.searchsorted(ep[:, indexv2.FIRST], row, side="right")) - 1
        raise IndexFormatError(f"{file} is damaged: episode {idcols.id_text(cols['ids'], n)!r} "
                               f"frame {row - int(ep[n, indexv2.FIRST])} "
                               f"holds {int(cols['size'][row])} bytes, fewer than one step of its arrays "
                               f"({int(least[n])} bytes by their shapes); re-shard with write --overwrite")


def parse(raw: bytes, file: Path | str) -> object:
    """The JSON in an index file's bytes; an `IndexFormatError` naming ``file`` if it is not JSON."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise IndexFormatError(f"{file}: nested too deeply to be an index; re-shard with --overwrite") from None
    except ValueError as e:  # JSONDecodeError, or bytes that are not UTF-8
        raise IndexFormatError(f"{file}: not valid JSON ({e}); re-shard with --overwrite") from None


def version_of(data: object, file: Path | str) -> int:
    """The format version of a parsed index; an `IndexFormatError` for another format or a version not read here."""
    if not isinstance(data, dict) or data.get("format") != FORMAT_NAME:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise IndexFormatError(f"{file}: not an episodepipes shard index (format={found!r})")
    version = data.get("version")
    if version not in VERSIONS or type(version) is not int:
        raise IndexFormatError(
            f"{file}: index version {version!r}, this episodepipes reads versions {list(VERSIONS)}; "
            "re-shard with this version's scripts/shard.py write --overwrite, or install the matching episodepipes"
        )
    return version


def warn_v1(file: Path | str, root: Path | str) -> None:
    """Log, once per file and process, that a v1 index costs per frame to open and how to upgrade it."""
    key = str(file.resolve()) if isinstance(file, Path) else file
    if key not in _WARNED:
        _WARNED.add(key)
        log.warning("%s is an index of format version 1, which costs time and memory per frame to open; "
                    "rewrite it as version 2 with: episodepipes-shard upgrade %s", file, root)


def warn_listed_ids(file: Path | str, root: Path | str) -> None:
    """Log, once per file and process, that an index listing its ids in its JSON costs per episode to open."""
    key = "ids:" + (str(file.resolve()) if isinstance(file, Path) else file)
    if key not in _WARNED:
        _WARNED.add(key)
        log.warning("%s lists its episode ids in its JSON (written by an older episodepipes), which costs time and "
                    "memory per episode to open; rewrite it with: episodepipes-shard upgrade %s", file, root)
