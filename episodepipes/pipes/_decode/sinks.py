"""Frame sinks: where decode workers put a sample's camera frames.

- `Allocate`: fresh arrays per frame (the collator then stacks them);
- `BatchRows`: threads decode straight into rows of reused ``[batch, 3, H, W]`` buffers, so a batch is a
  view of one buffer and collation copies no pixels;
- `SharedRing`: processes decode into a ring of shared buffers they were given; only the
  sample's small fields travel back pickled.

A sink hands out a `Claim` per sample, in sample order, from the thread that reads the source.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

from episodepipes.pipes._decode.slabs import Shapes, Slabs, worker_rows
from episodepipes.pipes.sample import RawSample
from episodepipes.pipes.sample_decode import Decoded, EpisodeSpec, Rows, SampleDecode


class Claim(NamedTuple):
    """Where one sample's frames go: ``rows`` (the parent's view; None: the worker allocates), and the
    ``ticket`` the worker gets: those rows (threads) or their ``(ring, slab, row)`` address (processes).
    A named tuple: one is made per sample, and a frozen dataclass costs several attribute sets to make."""

    rows: Rows | None = None
    ticket: Rows | tuple[int, int, int] | None = None

    @property
    def shared(self) -> bool:
        """The frames land in shared memory: the worker does not send them back."""
        return isinstance(self.ticket, tuple)


NOWHERE = Claim()


class FrameSink(Protocol):
    def start(self, shapes: Shapes, in_flight: int) -> None:
        """A pass begins (before its workers start: processes are given what this makes)."""
        ...

    def claim(self, shapes: Shapes) -> Claim:
        """The place of the next sample's frames."""
        ...

    def end(self) -> None:
        """The pass is over; the next one starts a fresh batch."""
        ...


class Allocate:
    """Every frame in a fresh array."""

    def start(self, shapes: Shapes, in_flight: int) -> None:
        pass

    def claim(self, shapes: Shapes) -> Claim:
        return NOWHERE

    def end(self) -> None:
        pass


class BatchRows:
    """Frames into rows of batch buffers that outlive a pass (no page faults after the first)."""

    def __init__(self, slabs: Slabs) -> None:
        self.slabs = slabs

    def start(self, shapes: Shapes, in_flight: int) -> None:
        pass

    def claim(self, shapes: Shapes) -> Claim:
        rows, _ = self.slabs.next_rows(shapes)
        return NOWHERE if rows is None else Claim(rows, rows)

    def end(self) -> None:
        self.slabs.unshare()


class SharedRing(BatchRows):
    """Frames into a ring of shared batch buffers made before the worker processes start (`Slabs.ring`)."""

    def start(self, shapes: Shapes, in_flight: int) -> None:
        # enough slabs for the frames in flight, the batch being built and two the consumer holds
        self.slabs.share(shapes, -(-in_flight // self.slabs.size) + 3)

    def claim(self, shapes: Shapes) -> Claim:
        rows, addr = self.slabs.next_rows(shapes)
        return NOWHERE if rows is None or addr is None else Claim(rows, addr)  # no slab free: pickled back


def decode_into(fn: SampleDecode, raw: RawSample, spec: EpisodeSpec,
                ticket: Rows | tuple[int, int, int] | None) -> Decoded:
    """In a worker: ``fn`` with the frames put where ``ticket`` says; frames written into shared memory are
    left out of the result (the parent has them already)."""
    if not isinstance(ticket, tuple):
        return fn(raw, spec, ticket)
    out = fn(raw, spec, worker_rows(ticket))
    for cam in spec.cameras:
        out.fields.pop(cam, None)
    return out
