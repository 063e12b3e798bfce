"""The training pipe (the public path ``episodepipes.pipes.train``): `train_pipe` builds a `TrainReader` graph.

`builder` holds `train_pipe`, above `reader` (the `TrainReader` node it builds); `mix` and `mix_reader` the mixture
of sources; `packed` the video-codec reads; `state` the resumable state every train pipe shares.
"""

from episodepipes.pipes.train.builder import block_options, task_chunk, train_pipe
from episodepipes.pipes.train.reader import READ_AHEAD, SHUFFLES, STEPS_AHEAD, TrainReader

__all__ = ["READ_AHEAD", "SHUFFLES", "STEPS_AHEAD", "TrainReader", "block_options", "task_chunk", "train_pipe"]
