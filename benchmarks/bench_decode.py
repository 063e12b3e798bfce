"""Open-pass decode throughput (camera frames/s) on real footage against the decode ceiling and plain webdataset.

Footage: `benchmarks.footage` (Debian's vtest.avi, Megamind.avi, cockatoo.mp4) at 480x640, sharded by our writer;
generated frames (`SyntheticReader`) are a second row only.
- ceiling: the same JPEG bytes, already in memory, through a bare ``simplejpeg.decode_jpeg`` (libjpeg-turbo) loop on
  2 threads; the resize rows' reference is a bare ``cv2.imdecode`` + ``cv2.resize``;
- baselines: ``webdataset.WebDataset(urls).decode(...)`` + ``DataLoader(num_workers=2)``, the pipeline a
  user would otherwise write, with webdataset's ``"torchrgb8"`` decoder (PIL) and with a cv2 handler
  (``cv2.imdecode`` + RGB + CHW tensor, the decoder ours uses); both rows, labelled;
- ours: `video_pipe` over every episode (read, decode, collate into ``[B, 3, H, W]`` batches).
Also: what reduced decode gains at 1/2 and 1/4 size, and what decoding straight into batch rows gains
over decoding to per-frame arrays and stacking them (about 0.25 ms a frame at 480x640, memory-bound).
"""

from __future__ import annotations

import glob
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import cv2
import numpy as np

from episodepipes.pipes import EpisodeIndex, ShardReader, video_pipe
from episodepipes.pipes.plan import Item
from episodepipes.sharding.formats.synthetic import SyntheticReader
from episodepipes.sharding.write.encode import EncodeOptions, encode_episode
from episodepipes.sharding.write.writer import ShardWriter

BATCH = 16


def make_data(workdir: Path, quick: bool, *, height: int = 480, width: int = 640) -> EpisodeIndex:
    """Synthetic 2-camera episodes sharded into ``workdir/data`` (reused when already there)."""
    n, length = (4, 48) if quick else (8, 60)
    out = workdir / f"data-{n}x{length}-{height}x{width}"
    if not (out / "index.json").exists():
        reader = SyntheticReader(num_episodes=n, length=length, height=height, width=width)
        with ShardWriter(out, shard_size=3 << 20, options={"jpeg_quality": 90}) as w:
            for eid in reader.episode_ids():
                w.add(encode_episode(reader.read(eid), EncodeOptions(jpeg_quality=90)))
    return EpisodeIndex.open(out)


def best(fn: Callable[[], int], reps: int) -> float:
    """Best frames/s over ``reps`` runs of ``fn`` (which returns frames done): the least disturbed run."""
    rates = []
    for _ in range(reps):
        t0 = time.perf_counter()
        n = fn()
        rates.append(n / (time.perf_counter() - t0))
    return max(rates)


def paired(ours: Callable[[], int], ref: Callable[[], int], reps: int) -> tuple[float, float]:
    """(ours, ref) frames/s from back-to-back runs, the pair with the median ratio.

    On a shared 2-core machine another job can take a core for seconds; runs side by side see the
    same machine, so their ratio is stable even when both rates move.
    """
    pairs = sorted(((best(ours, 1), best(ref, 1)) for _ in range(reps)), key=lambda p: p[0] / p[1])
    return pairs[len(pairs) // 2]


def _jpegs(index: EpisodeIndex) -> list[bytes]:
    items = [Item(e.id, f) for e in index.episodes for f in range(e.length)]
    return [bytes(v) for r in ShardReader(index, items) for k, v in r.members.items() if k.endswith(".jpg")]


def _ceiling(jpegs: list[bytes], size: tuple[int, int] | None = None, turbo: bool = False) -> int:
    import simplejpeg

    def one(b: bytes) -> None:
        if turbo:
            simplejpeg.decode_jpeg(b)
            return
        img = cv2.imdecode(np.frombuffer(b, np.uint8), cv2.IMREAD_COLOR)
        if size is not None:
            cv2.resize(img, size[::-1], interpolation=cv2.INTER_AREA)

    with ThreadPoolExecutor(2) as ex:
        for _ in ex.map(one, jpegs, chunksize=8):
            pass
    return len(jpegs)


def _ours(index: EpisodeIndex, **kw: object) -> Callable[[], int]:
    """One open pass of a pipe built once, as Lightning iterates a val loader every validation."""
    pipe = video_pipe(index, episodes=[e.id for e in index.episodes], batch_size=BATCH, max_batches=10**6,
                      num_workers=2, **kw)  # type: ignore[arg-type]

    def one_pass() -> int:
        before = pipe.stats["frames_decoded"]
        for _ in pipe:
            pass
        return pipe.stats["frames_decoded"] - before

    one_pass()  # warm-up: the first pass allocates the batch buffers every later pass reuses
    return one_pass


def cv2_torchrgb8(key: str, data: bytes) -> object:
    """A webdataset handler giving what ``"torchrgb8"`` gives (uint8 CHW RGB tensor), decoded by cv2."""
    if not key.endswith(".jpg"):
        return None
    import torch

    img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    return torch.from_numpy(cv2.cvtColor(img, cv2.COLOR_BGR2RGB)).permute(2, 0, 1)


def _webdataset(index: EpisodeIndex, decoder: object = "torchrgb8") -> int:
    import torch
    import webdataset as wds

    urls = sorted(glob.glob(str(index.root / "shard-*.tar")))
    ds = wds.WebDataset(urls, shardshuffle=False, empty_check=False).decode(decoder)
    n = 0
    for b in torch.utils.data.DataLoader(ds, batch_size=BATCH, num_workers=2):
        n += 2 * len(b["__key__"])
    return n


def _copying(index: EpisodeIndex) -> int:
    """Our graph with decoding into per-frame arrays that the stacker then copies (``slab=0``)."""
    from torchdata.nodes import Loader

    from episodepipes.pipes import BatchStacker, Decoder, Gate, Stats

    stats = Stats()
    items = [Item(e.id, f) for e in index.episodes for f in range(e.length)]
    root = Gate(lambda: BatchStacker(Decoder(ShardReader(index, items, stats=stats), index, stats=stats, slab=0),
                                 batch_size=BATCH, stats=stats))
    for _ in Loader(root):
        pass
    return stats["frames_decoded"]


def run(workdir: Path, quick: bool) -> dict:
    from benchmarks.footage import shard_footage

    n, length = (4, 48) if quick else (8, 60)
    index = shard_footage(workdir / f"footage-{n}x{length}-480x640", episodes=n, length=length, size=(480, 640),
                          shard_size=3 << 20)
    jpegs = _jpegs(index)
    reps = 5 if quick else 7
    h, w = index.episodes[0].cameras["front"].height, index.episodes[0].cameras["front"].width
    ours_t, ceiling = paired(_ours(index), lambda: _ceiling(jpegs, turbo=True), reps)
    ours_p, ceiling_p = paired(_ours(index, method="process"), lambda: _ceiling(jpegs, turbo=True), reps)
    generated = make_data(workdir, quick)
    gen_jpegs = _jpegs(generated)
    gen_t, gen_ceiling = paired(_ours(generated), lambda: _ceiling(gen_jpegs, turbo=True), max(3, reps - 2))
    wds_rate = best(lambda: _webdataset(index), 2 if quick else 3)
    wds_cv2 = best(lambda: _webdataset(index, cv2_torchrgb8), 2 if quick else 3)
    rows = [
        {"metric": f"open pass {h}x{w}, threads, vs webdataset decode('torchrgb8') (PIL)", "ours": ours_t,
         "baseline": wds_rate, "ceiling": ceiling, "unit": "frames/s",
         "note": "footage; ceiling: bare simplejpeg on 2 threads, run back to back (goal >= 0.85 of it)"},
        {"metric": f"open pass {h}x{w}, threads, vs webdataset + cv2 handler", "ours": ours_t,
         "baseline": wds_cv2, "ceiling": ceiling, "unit": "frames/s",
         "note": "baseline: .decode(cv2 imdecode -> RGB CHW tensor), the decoder ours uses; goal >= 1.0x"},
        {"metric": f"open pass {h}x{w}, processes, vs webdataset + cv2 handler", "ours": ours_p, "baseline": wds_cv2,
         "ceiling": ceiling_p, "unit": "frames/s", "note": "method='process' (fork-server workers, mallopt-tuned)"},
        {"metric": f"open pass {h}x{w}, generated frames (second row), threads", "ours": gen_t, "baseline": None,
         "ceiling": gen_ceiling, "unit": "frames/s",
         "note": "SyntheticReader frames (smoother than footage); ceiling: bare simplejpeg, back to back"},
    ]
    series = {"ceiling": ceiling, "threads": ours_t, "processes": ours_p, "webdataset_pil": wds_rate,
              "webdataset_cv2": wds_cv2}
    for div in (2, 4):
        size = (h // div, w // div)
        red, full = paired(_ours(index, resize=size), lambda s=size: _ceiling(jpegs, s), reps)
        rows.append({"metric": f"resize to 1/{div} ({size[0]}x{size[1]}), reduced decode", "ours": red,
                     "baseline": full, "ceiling": None, "unit": "frames/s",
                     "note": "baseline: bare full decode + cv2.resize on 2 threads"})
        series[f"reduced_{div}"], series[f"full_resize_{div}"] = red, full
    rows_t, copying = paired(_ours(index), lambda: _copying(index), reps)
    rows.append({"metric": f"open pass {h}x{w}, decode into batch rows", "ours": rows_t, "baseline": copying,
                 "ceiling": None, "unit": "frames/s",
                 "note": "baseline: same graph decoding to per-frame arrays, then stacked into reused buffers"})
    series.update(copying_collate=copying, jpegs=len(jpegs))
    return {"section": "decode", "rows": rows, "series": series,
            "intro": __doc__.split("\n\n", 1)[1].split("\n\n")[0] + "\n\n"
                     f"{len(jpegs)} JPEGs of footage ({h}x{w}, 2 cameras), batch {BATCH}, 2 workers everywhere. "
                     f"Ours and its reference run back to back {reps} times; the pair with the median ratio is shown."}
