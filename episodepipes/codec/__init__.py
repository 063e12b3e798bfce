"""The video-codec layer: frames to packets (h264/AV1), packets copied from existing files, packets back to
frames through a reused decoder, and the packing of a chunk's packets and arrays into one tar member."""

from episodepipes.codec.copy import MAX_GOP, copy_packets
from episodepipes.codec.decode import PacketDecoder
from episodepipes.codec.encode import X264_REPRODUCIBLE, CodecOptions, encode_frames, same_scheduling
from episodepipes.codec.pack import (
           Chunk,
           gop_chunks,
           pack,
           pack_arrays,
           pack_packets,
           tar_framing,
           unpack,
           unpack_arrays,
)
from episodepipes.codec.stream import DECODERS, Packets

__all__ = ["Chunk", "CodecOptions", "DECODERS", "MAX_GOP", "PacketDecoder", "Packets", "copy_packets", "encode_frames",
           "gop_chunks", "pack", "pack_arrays", "pack_packets", "same_scheduling", "tar_framing", "unpack",
           "unpack_arrays", "X264_REPRODUCIBLE"]
