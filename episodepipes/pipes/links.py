"""The links between nodes beyond torchdata's contract: each one is passed by a builder, never probed for.

Nodes talk through ``reset``/``next``/``get_state``. Where a node can do better knowing more of a neighbour, the
builder that made both passes that neighbour in explicitly, as one of these small interfaces:

- `Cursor`, of a train reader (`TrainReader`, the mixture's `MixReader`): ``Decoder(reader, ..., cursor=reader)``
  keeps each sample's cursor in flight, not a state dict, and makes the dict only when a state is asked for.
- `SendSlices`, a train reader's ``send_slices``: ``Decoder(reader, ..., slices=reader.send_slices)`` has the
  reader hand out `ShardSlice` references when the decoder's workers are processes (they read the bytes).
- `RowsProvider`, a `Decoder`: ``BatchStacker(decoder, ..., rows=decoder)`` has the decoder lay frames out in the
  stacker's batch rows, so collation copies no pixels.

A graph composed by hand from the public nodes needs none of them: without the argument the feature stays off
and the output is the same.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["Cursor", "RowsProvider", "SendSlices"]


class Cursor(Protocol):
    """A node whose state is a function of a small, cheap cursor: the `Decoder` keeps one per sample in flight."""

    def cursor(self) -> Any:
        """Where the node is now, as a value `state_at` turns into its state dict."""
        ...

    def state_at(self, cursor: Any) -> dict[str, Any]:
        """The node's state dict at ``cursor`` (``state_at(cursor())`` is its ``state_dict()``)."""
        ...


SendSlices = Callable[[], None]
"""Have the source hand out frames as `ShardSlice` references (which decode processes resolve themselves)."""


class RowsProvider(Protocol):
    """A node that can decode its samples into the rows of the batches the node right after it stacks."""

    def batch_rows(self, size: int) -> None:
        """Lay the samples out as rows of ``size``-sample batch buffers, counted from each pass's start."""
        ...
