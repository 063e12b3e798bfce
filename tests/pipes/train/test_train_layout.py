"""train_pipe's decode path: frames land in batch rows (no pixel copy at collation), and match a plain decode."""

import numpy as np
import pytest
import torch
from helpers import make_shards

from episodepipes.pipes import EpisodeIndex
from episodepipes.pipes._decode.buffers import consecutive_rows
from episodepipes.pipes.batch import BatchStacker
from episodepipes.pipes.decode import Decoder
from episodepipes.pipes.frames import decode_jpeg
from episodepipes.pipes.train import TrainReader, train_pipe
from episodepipes.tarmembers import frame_fields

SHAPE = dict(num_episodes=3, length=10, height=32, width=48)


def _plain(idx, episode, frame, cam):
    """The frame as a plain read and decode of its JPEG gives it."""
    ep = idx.episode(episode)
    shard, start, end = ep.frame_range(frame)
    data = idx.shard_path(shard).read_bytes()
    jpg = frame_fields(lambda n, o: data[o:o + n], start, end, episode, frame)[0][f"{cam}.jpg"]
    return decode_jpeg(jpg, src=(ep.cameras[cam].height, ep.cameras[cam].width))


@pytest.mark.parametrize("method", ["thread", "process"])
def test_the_decoder_writes_each_sample_into_the_row_of_its_batch(tmp_path, method):
    idx = EpisodeIndex.open(make_shards(tmp_path / "s", **SHAPE))
    reader = TrainReader(idx, idx.split("train"), windows={}, seed=0, rank=0, world_size=1, batch_size=4,
                         epochs=1)
    dec = Decoder(reader, idx, num_workers=2, method=method)
    BatchStacker(dec, batch_size=4, rows=dec)  # as train_pipe wires it: the stacker asks its decoder for batch rows
    dec.reset(None)
    samples = [next(dec) for _ in range(4)]
    for cam in ("front", "wrist"):  # one buffer's rows 0..3: the batch is a view, not a stack of copies
        rows = consecutive_rows([s[cam] for s in samples])
        assert rows is not None and rows.shape == (4, 3, 32, 48)
    for s in samples:
        for cam in ("front", "wrist"):
            np.testing.assert_array_equal(s[cam], _plain(idx, s["episode"], s["frame"], cam))
    dec.shutdown()


@pytest.mark.parametrize("method", ["thread", "process"])
def test_batches_held_by_the_consumer_keep_their_frames(tmp_path, method):
    idx = EpisodeIndex.open(make_shards(tmp_path / "s", **SHAPE))
    pipe = train_pipe(idx, batch_size=4, seed=1, rank=0, world_size=1, num_workers=2, method=method, epochs=2)
    held = [b for b in pipe]  # every batch kept: no buffer may be reused under them
    assert len(held) == len(pipe) > 4
    for b in held:
        for i, (e, f) in enumerate(zip(b["episode"], b["frame"].tolist())):
            for cam in ("front", "wrist"):
                np.testing.assert_array_equal(b[cam][i].numpy(), _plain(idx, e, f, cam))


@pytest.mark.parametrize("method", ["thread", "process"])
def test_a_stacked_decoder_sends_samples_in_chunks_and_resumes_inside_one(tmp_path, method):
    idx = EpisodeIndex.open(make_shards(tmp_path / "s", **SHAPE))

    def pipe():
        return train_pipe(idx, batch_size=4, seed=2, rank=0, world_size=1, num_workers=2, method=method)

    reader = TrainReader(idx, idx.split("train"), windows={}, seed=0, rank=0, world_size=1, batch_size=4,
                         epochs=1)
    dec = Decoder(reader, idx, num_workers=2, method=method)
    assert dec.chunk == (1 if method == "thread" else 8)  # processes pickling frames back chunk already
    BatchStacker(dec, batch_size=4, rows=dec)
    assert dec.chunk > 1 and dec.prefetch >= 2 * dec.chunk * 2  # a task per chunk, two per worker in flight
    ref = [(e, f) for b in pipe() for e, f in zip(b["episode"], b["frame"].tolist())]
    p = pipe()
    it = iter(p)
    head = [(e, f) for _ in range(2) for b in [next(it)] for e, f in zip(b["episode"], b["frame"].tolist())]
    state = p.state_dict()  # taken with chunks in flight: resumes at the first sample not handed out
    q = pipe()
    q.load_state_dict(state)
    rest = [(e, f) for b in q for e, f in zip(b["episode"], b["frame"].tolist())]
    assert head + rest == ref


def test_train_pipe_tasks_carry_a_batchs_share_per_worker(tmp_path):
    idx = EpisodeIndex.open(make_shards(tmp_path / "s", num_episodes=3, length=30, height=16, width=16))

    def decoder(batch: int, workers: int, method: str = "process") -> Decoder:
        pipe = train_pipe(idx, batch_size=batch, seed=0, rank=0, world_size=1, num_workers=workers, method=method)
        return pipe._root.source

    # each task costs messages and wake-ups on both sides: a worker's share of a batch goes as one task
    assert [decoder(32, 2).chunk, decoder(33, 2).chunk, decoder(30, 3).chunk, decoder(8, 2).chunk] == [16, 17, 10, 8]
    assert decoder(32, 2).prefetch == 64  # two tasks per worker in flight
    assert decoder(32, 2, "thread").chunk == 16  # threads too: a future and wake-ups per task
    p = train_pipe(idx, batch_size=32, seed=0, rank=0, world_size=1, num_workers=2, method="process")
    ref = train_pipe(idx, batch_size=32, seed=0, rank=0, world_size=1, num_workers=2, method="thread")
    for x, y in zip(p, ref, strict=True):  # the same batches
        assert x["episode"] == y["episode"] and torch.equal(x["front"], y["front"])


@pytest.mark.parametrize("method", ["thread", "process"])
def test_a_camera_window_is_decoded_into_its_batch_rows_padding_included(tmp_path, method):
    idx = EpisodeIndex.open(make_shards(tmp_path / "s", **SHAPE))
    pipe = train_pipe(idx, batch_size=4, seed=3, rank=0, world_size=1, num_workers=2, method=method,
                      history={"front": 3}, horizon={"state": 2})
    seen_pad = False
    for b in pipe:
        assert b["front"].shape == (4, 3, 3, 32, 48) and b["wrist"].shape == (4, 3, 32, 48)
        for i, (e, f) in enumerate(zip(b["episode"], b["frame"].tolist())):
            for j, pad in enumerate(b["front_pad"][i].tolist()):
                step = max(f - 2 + j, 0)
                assert pad == (f - 2 + j < 0)
                seen_pad |= pad
                np.testing.assert_array_equal(b["front"][i, j].numpy(), _plain(idx, e, step, "front"))
    assert seen_pad
    assert pipe.stats["frames_corrupt"] == 0
