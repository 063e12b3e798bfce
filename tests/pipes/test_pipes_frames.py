"""The frame-decoder seam: a `FrameDecoder` other than JPEG plugs into the Decoder, and the per-sample
decode reports what it decoded and what is corrupt without a side channel."""

from dataclasses import dataclass

import numpy as np
import pytest
from helpers import make_shards

from episodepipes.pipes import BatchStacker, Decoder, EpisodeIndex, ShardReader
from episodepipes.pipes.frames import JPEG
from episodepipes.pipes.plan import Item
from episodepipes.pipes.sample import RawSample
from episodepipes.pipes.sample_decode import EpisodeSpec, SampleDecode


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    return EpisodeIndex.open(make_shards(tmp_path_factory.mktemp("frames") / "s", num_episodes=2, length=5,
                                         height=16, width=24))


@dataclass(frozen=True)
class FirstByteFrames:
    """A stand-in for a video-packet decoder: the frame is filled with its member's length mod 251, and the
    wrist camera's frames never decode. Module level, so it pickles into process workers."""

    def field(self, camera: str) -> str:
        return f"{camera}.jpg"

    def decode(self, camera, data, *, src, size=None, out=None):
        if camera == "wrist":
            return None
        out = np.empty((3, *(size or src)), np.uint8) if out is None else out
        out[...] = len(data) % 251
        return out


@pytest.mark.parametrize("method", ["thread", "process"])
def test_a_custom_frame_decoder_replaces_jpeg_in_the_decoder(index, method):
    items = [Item("ep0001", f) for f in range(5)]
    sizes = [len(r.members["front.jpg"]) % 251 for r in ShardReader(index, items)]
    dec = Decoder(ShardReader(index, items), index, method=method, frames=FirstByteFrames(), slab=2)
    batches = list(BatchStacker(dec, batch_size=2, rows=dec))
    fronts = [int(v) for b in batches for v in b["front"].amax((1, 2, 3))]
    assert fronts == sizes
    assert all(int(b["wrist"].max()) == 0 for b in batches)  # corrupt: zeros, valid=False, counted
    assert [v for b in batches for v in b["valid"].tolist()] == [False] * 5
    assert dec.stats["frames_decoded"] == 5 and dec.stats["frames_corrupt"] == 5


def test_sample_decode_counts_decoded_and_corrupt_frames_itself(index):
    ep = index.episode("ep0000")
    raw = next(iter(ShardReader(index, [Item("ep0000", 2)])))
    spec = EpisodeSpec.of(ep)
    out = SampleDecode()(raw, spec)
    assert out.frames == 2 and out.corrupt == []
    assert out.fields["front"].shape == (3, 16, 24) and out.fields["frame"] == 2 and out.fields["valid"]
    broken = RawSample(raw.item, raw.shard, {**raw.members, "front.jpg": b"not a jpeg"})
    out = SampleDecode(frames=JPEG)(broken, spec)
    assert out.frames == 1 and out.corrupt == ["front"] and not out.fields["front"].any()
    rows = {"front": np.full((3, 16, 24), 7, np.uint8), "wrist": np.full((3, 16, 24), 7, np.uint8)}
    out = SampleDecode()(RawSample(raw.item, raw.shard, raw.members, damaged="crc32 mismatch"), spec, rows)
    assert out.frames == 0 and out.corrupt == ["front", "wrist"]
    assert out.fields["front"] is rows["front"] and not rows["front"].any()  # zeroed in its batch row
