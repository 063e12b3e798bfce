import threading

import av
import numpy as np
import pytest

from episodepipes.codec import CodecOptions, PacketDecoder, encode_frames
from episodepipes.sharding.formats.synthetic import SyntheticReader

CODECS = ("h264", "av1")


@pytest.fixture(scope="module", params=CODECS)
def stream(request):
    frames = list(SyntheticReader(num_episodes=1, length=12, height=64, width=96, cameras=("front",))
                  .read("ep0000").cameras["front"])
    return encode_frames(frames, CodecOptions(codec=request.param, gop=4))


def _sequential(p):
    """Every frame from one decoder fed the whole stream, never reset: the reference random access must match."""
    ctx = av.CodecContext.create({"h264": "h264", "av1": "libdav1d"}[p.codec], "r")
    out = [f for q in p.data for f in ctx.decode(av.Packet(q))] + list(ctx.decode(None))
    return [f.to_ndarray(format="rgb24").transpose(2, 0, 1) for f in out]


def _gop(p, t):
    k = p.keyframe_of(t)
    return k, p.data[k:p.lead + t + 1], p.lead + t - k


def test_random_access_is_bit_exact_against_a_sequential_decode(stream):
    seq = _sequential(stream)
    assert len(seq) == 12
    for t in [7, 0, 11, 4, 5, 3]:  # out of order, each from its own keyframe, through one reused decoder
        d = PacketDecoder(stream.codec, stream.extradata)
        k, packets, i = _gop(stream, t)
        got = d.frame(k, packets, i)
        assert got.dtype == np.uint8 and got.shape == (3, 64, 96) and got.flags.c_contiguous
        assert np.array_equal(got, seq[t]), t
    d = PacketDecoder(stream.codec, stream.extradata)
    assert all(np.array_equal(d.frame(*_gop(stream, t)), seq[t]) for t in [9, 2, 6, 10, 1])


def test_consecutive_frames_never_decode_a_packet_twice(stream):
    seq = _sequential(stream)
    d = PacketDecoder(stream.codec, stream.extradata)
    for t in range(12):  # a whole episode, one frame per call
        assert np.array_equal(d.frame(*_gop(stream, t)), seq[t])
    assert d.decoded == 12
    d = PacketDecoder(stream.codec, stream.extradata)
    for t in range(3, 12):  # a sliding history window of 4 frames ending at t
        window = [d.frame(*_gop(stream, s)) for s in range(t - 3, t + 1)]
        assert all(np.array_equal(w, seq[s]) for w, s in zip(window, range(t - 3, t + 1)))
    assert d.decoded == 12
    d.frames(*_gop(stream, 11))  # the GOP it holds: nothing more to decode
    assert d.decoded == 12


def test_a_forward_reader_keeps_only_its_tail_and_an_earlier_frame_decodes_its_gop_again(stream):
    from episodepipes.codec.decode import _GONE

    seq = _sequential(stream)
    d = PacketDecoder(stream.codec, stream.extradata, size=(64, 96))
    for t in range(8):  # whole GOPs of 4 in order, as video_pipe reads them
        assert np.array_equal(d.frame(*_gop(stream, t), tail=1), seq[t])
    assert d.decoded == 8 and not d._older and [f is _GONE for f in d._frames] == [True, True, False, False]
    assert np.array_equal(d.frame(*_gop(stream, 6), tail=1), seq[6]) and d.decoded == 8  # in the tail
    assert np.array_equal(d.frame(*_gop(stream, 5), tail=1), seq[5]) and d.decoded == 10  # dropped: 4 and 5 again
    assert np.array_equal(d.frame(*_gop(stream, 1)), seq[1]) and d.decoded == 12  # GOP 0 was not kept
    assert [np.array_equal(f, s) for f, s in zip(d.frames(*_gop(stream, 7)), seq[4:])] == [True] * 4


def test_only_the_last_keep_gops_are_kept(stream):
    seq = _sequential(stream)
    d = PacketDecoder(stream.codec, stream.extradata, keep=2)
    d.frame(*_gop(stream, 1))
    d.frame(*_gop(stream, 9))
    assert np.array_equal(d.frame(*_gop(stream, 0)), seq[0]) and d.decoded == 2 + 2  # kept
    assert np.array_equal(d.frame(*_gop(stream, 2)), seq[2]) and d.decoded == 2 + 2 + 3  # kept, but only 0..1
    d.frame(*_gop(stream, 5))
    assert np.array_equal(d.frame(*_gop(stream, 8)), seq[8]) and d.decoded == 2 + 2 + 3 + 2 + 1  # GOP 8 evicted


def _damaged(p, which, how):
    data = list(p.data[:8])
    b = data[which]
    data[which] = b[:len(b) // 2] if how == "truncated" else \
        bytes(np.random.default_rng(0).integers(0, 256, len(b), dtype=np.uint8))
    return data


@pytest.mark.parametrize("how", ["truncated", "garbage"])
@pytest.mark.parametrize("which", [4, 5])  # a keyframe, and the frame after it
def test_a_damaged_packet_gives_none_for_it_and_the_rest_of_its_gop(stream, which, how):
    seq = _sequential(stream)
    d = PacketDecoder(stream.codec, stream.extradata, size=(64, 96))
    data = _damaged(stream, which, how)
    assert [np.array_equal(f, s) for f, s in zip(d.frames(0, data[:4], 3), seq)] == [True] * 4
    got = d.frames(4, data[4:8], 3)
    assert [g is None for g in got] == [i >= which - 4 for i in range(4)]
    assert all(np.array_equal(g, s) for g, s in zip(got, seq[4:]) if g is not None)
    assert np.array_equal(d.frame(8, stream.data[8:12], 3), seq[11])  # the decoder recovers at the next GOP


def test_a_frame_of_the_wrong_size_is_refused(stream):
    d = PacketDecoder(stream.codec, stream.extradata, size=(64, 98))
    assert d.frames(0, stream.data[:4], 3) == [None] * 4


def test_bad_arguments_are_refused_by_name(stream):
    with pytest.raises(ValueError, match="codec="):
        PacketDecoder("mjpeg")
    for kw in ({"threads": 0}, {"keep": 0}):
        with pytest.raises(ValueError, match=f"{next(iter(kw))}=0"):
            PacketDecoder("h264", **kw)
    with pytest.raises(ValueError, match="upto="):
        PacketDecoder(stream.codec).frames(0, stream.data[:4], 4)


def test_packets_after_a_damaged_one_are_not_decoded(stream):
    d = PacketDecoder(stream.codec, stream.extradata, size=(64, 96))
    data = _damaged(stream, 5, "truncated")
    d.frames(0, data[:4], 3)
    assert d.frames(4, data[4:8], 3)[1:] == [None] * 3
    assert d.decoded == 4 + 2  # the keyframe and the damaged packet; nothing that depends on it


def test_a_frame_is_written_into_the_caller_s_array_and_is_the_caller_s(stream):
    seq = _sequential(stream)
    d = PacketDecoder(stream.codec, stream.extradata)
    rows = np.full((2, 3, 64, 96), 7, np.uint8)  # two batch rows
    for t in (4, 5):
        got = d.frame(*_gop(stream, t), out=rows[t - 4])
        assert got is not None and np.shares_memory(got, rows[t - 4])
    assert np.array_equal(rows[0], seq[4]) and np.array_equal(rows[1], seq[5])
    rows[:] = 0  # the caller writes into its rows: the decoder's kept frames are not those
    again = d.frame(*_gop(stream, 5))
    assert np.array_equal(again, seq[5]) and d.decoded == 2
    again[:] = 0  # nor is a new array it returns
    assert np.array_equal(d.frame(*_gop(stream, 5)), seq[5])
    wrong = np.zeros((3, 32, 96), np.uint8)  # not the frame's size, or not contiguous: a new array instead
    assert not np.shares_memory(d.frame(*_gop(stream, 5), out=wrong), wrong)
    strided = np.zeros((3, 64, 192), np.uint8)[:, :, ::2]
    assert np.array_equal(d.frame(*_gop(stream, 5), out=strided), seq[5]) and not strided.any()



def test_a_pass_reuses_the_decoder_of_a_finished_gop_and_decodes_each_packet_once(stream):
    from episodepipes.codec.pool import DecoderPool

    seq = _sequential(stream)
    pool = DecoderPool(stream.codec, stream.extradata, size=(64, 96))
    out = np.empty((3, 64, 96), np.uint8)
    for t in range(12):  # a whole episode in order, GOPs of 4: the decoder of a GOP whose last frame is out is free
        k, packets, i = _gop(stream, t)
        assert np.array_equal(pool.frame(k, packets, i, out=out, last=i == 3), seq[t])
    assert len(pool._all) == 1 and pool.decoded == 12
    pool = DecoderPool(stream.codec, stream.extradata, size=(64, 96))
    for t in [0, 4, 1, 5]:  # an unfinished GOP's decoder is not taken for another GOP while there is room
        assert np.array_equal(pool.frame(*_gop(stream, t), out=out), seq[t])
    assert len(pool._all) == 2 and pool.decoded == 4


class _Held(list):
    """Packets whose first read blocks until ``go`` is set (``entered`` says it is there): holds a decode midway."""

    def __init__(self, packets):
        super().__init__(packets)
        self.entered, self.go = threading.Event(), threading.Event()

    def __getitem__(self, i):
        self.entered.set()
        assert self.go.wait(10)
        return super().__getitem__(i)


def test_a_frame_of_a_gop_whose_decoder_moved_on_waits_for_it_and_decodes_nothing_again(stream):
    """Two threads: one's frame 3 of GOP 0 (its last) frees the decoder, which it takes for GOP 1 while the
    other thread still wants frame 2 of GOP 0: that frame comes from the decoder's kept GOP, not a new decode."""
    from episodepipes.codec.pool import DecoderPool

    seq = _sequential(stream)
    pool = DecoderPool(stream.codec, stream.extradata, size=(64, 96))
    for t in (0, 1, 3):
        k, packets, i = _gop(stream, t)
        pool.frame(k, packets, i, last=i == 3)
    k, packets, i = _gop(stream, 4)
    held, got = _Held(packets), {}
    a = threading.Thread(target=lambda: got.update(a=pool.frame(k, held, i)))
    a.start()
    assert held.entered.wait(10)  # thread a decodes GOP 1 on GOP 0's decoder
    b = threading.Thread(target=lambda: got.update(b=pool.frame(*_gop(stream, 2))))
    b.start()
    b.join(0.3)
    held.go.set()
    a.join(10)
    b.join(10)
    assert np.array_equal(got["a"], seq[4]) and np.array_equal(got["b"], seq[2])
    assert pool.decoded == 5 and len(pool._all) == 1
