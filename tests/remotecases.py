"""The remote roots the pipe-equality tests run against (an S3 bucket, a GCS bucket, an HTTP site), each behind a
counter of the requests it answered, with what a test needs to set up objects there; and the synthetic shards the
remote source tests upload."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from s3server import CREDENTIALS

from episodepipes.format import FORMAT_NAME, shard_name
from episodepipes.index import v2 as indexv2
from episodepipes.sharding.formats.synthetic import SyntheticReader
from episodepipes.sharding.write import WriteOptions, write_shards


def upload_synthetic(moto, out: Path, bucket: str, prefix: str) -> Path:  # noqa: ANN001
    """Four 10-frame episodes in 60 kB shards at ``out``, uploaded to ``s3://bucket/prefix``."""
    write_shards(SyntheticReader(num_episodes=4, length=10, height=48, width=64), out,
                 WriteOptions(format="test", shard_size=60_000))
    moto.upload_dir(out, bucket, prefix)
    return out


FRAME_BYTES = 1024  # each synthetic frame's bytes in its (never written) shard


def synthetic_index(out: Path, *, episodes: int, frames: int, shards: int) -> Path:
    """An index v2 of ``frames`` frames in ``episodes`` equal episodes over ``shards`` shards (whole episodes each),
    written at ``out`` as the writer lays it out (index.json and every column), without the shards: what opening and
    looking frames up cost at any size, in the time numpy takes to fill the columns. Splits alternate train/val."""
    if frames % episodes or episodes % shards:
        raise ValueError(f"{frames=} should divide by {episodes=}, and it by {shards=}")
    length, per_shard = frames // episodes, episodes // shards
    n = np.arange(episodes, dtype=np.uint64)
    ep = np.zeros((episodes, 7), np.uint64)
    ep[:, indexv2.FIRST], ep[:, indexv2.LENGTH], ep[:, indexv2.SEGMENT] = n * length, length, n
    ep[:, indexv2.SPLIT] = n % 2
    seg = np.stack([n // per_shard, n * length, np.full(episodes, length, np.uint64)], axis=1)
    rows = np.arange(frames, dtype=np.uint64)
    cols = {"episodes": ep, "segments": seg, "offset": (rows % (per_shard * length)) * FRAME_BYTES,
            "size": np.full(frames, FRAME_BYTES, "<u4"), "crc32": np.zeros(frames, "<u4")}
    schema = {"cameras": {"cam": {"height": 8, "width": 8}}, "arrays": {"action": {"dtype": "<f4", "shape": [2]}}}
    data = {"format": FORMAT_NAME, "version": 2, "layout": "members", "crc32": True, "options": {},
            "shards": [{"name": shard_name(i), "bytes": (per_shard * length + 2) * FRAME_BYTES,
                        "samples": per_shard * length, "sha256": "0" * 64} for i in range(shards)],
            "schemas": [schema], "splits": ["train", "val"], "prompts": [""], "fps": [10.0],
            "ids": [f"ep{i:07d}" for i in range(episodes)], "frames": frames, "episode_meta": []}
    out.mkdir(parents=True, exist_ok=True)
    indexv2.write(out, data, cols)
    return out


def plain(batches) -> list[dict]:
    """Batches as comparable values: every tensor's dtype, shape and bytes, every list as it is."""
    import torch

    return [{k: (str(v.dtype), tuple(v.shape), v.numpy().tobytes()) if torch.is_tensor(v) else v
             for k, v in sorted(b.items())} for b in batches]


def s3_secrets_absent(*texts: str) -> None:
    for t in texts:
        for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            assert CREDENTIALS[k] not in t


def gcs_secrets_absent(gcs, *texts: str) -> None:  # noqa: ANN001
    """Neither the service account's key nor any bearer token the emulator was sent (nor a token's signature)."""
    from gcsserver import PRIVATE_KEY_ID

    tokens = [a.split(" ", 1)[1] for a in gcs.shim.authorization if a]
    key_body = "".join(gcs.private_key.splitlines()[1:-1])
    for t in texts:
        assert PRIVATE_KEY_ID not in t and key_body[:40] not in t and key_body[-40:] not in t
        assert all(tok not in t and tok.split(".")[2] not in t for tok in tokens)


@dataclass
class Root:
    """One remote root kind: ``url(prefix)`` names a prefix there, ``copy`` puts local shards under a prefix,
    ``put``/``delete`` change one object; ``counter`` (reset, gets, requests, body_bytes) sees every request."""

    kind: str
    counter: object
    url: Callable[[str], str]
    copy: Callable[[Path, str], None]
    put: Callable[[str, str, bytes], None]
    delete: Callable[[str, str], None]
    secrets_absent: Callable[..., None]
    logger: str | None  # the logger whose DEBUG lines must hold no secret (S3: not boto3's own lines)


def s3_root(moto, proxy, bucket: str) -> Root:  # noqa: ANN001
    c = moto.client()
    return Root("s3", proxy, lambda p: f"s3://{bucket}/{p}", lambda d, p: moto.upload_dir(d, bucket, p),
                lambda p, n, b: c.put_object(Bucket=bucket, Key=f"{p}/{n}", Body=b),
                lambda p, n: c.delete_object(Bucket=bucket, Key=f"{p}/{n}"), s3_secrets_absent, "episodepipes")


def gcs_root(gcs, gcs_proxy, bucket: str) -> Root:  # noqa: ANN001
    return Root("gs", gcs_proxy, lambda p: f"gs://{bucket}/{p}", lambda d, p: gcs.upload_dir(d, bucket, p),
                lambda p, n, b: gcs.put(bucket, f"{p}/{n}", b), lambda p, n: gcs.delete(bucket, f"{p}/{n}"),
                lambda *t: gcs_secrets_absent(gcs, *t), None)


def http_root(server) -> Root:  # noqa: ANN001
    """A static site: a prefix is a folder under ``server.root/data``; it holds no secret to leak."""
    def copy(d: Path, p: str) -> None:
        shutil.copytree(d, server.root / "data" / p, dirs_exist_ok=True)

    server.reset()
    return Root("https", server, lambda p: f"{server.endpoint}/data/{p}", copy,
                lambda p, n, b: (server.root / "data" / p / n).write_bytes(b),
                lambda p, n: (server.root / "data" / p / n).unlink(), lambda *t: None, None)
