"""Nodes talk through torchdata's contract and the links a builder passes (`episodepipes.pipes.links`), never
by probing a neighbour (``hasattr``/``getattr``/``isinstance`` of a source) for a side channel."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
from helpers import make_shards

import episodepipes.pipes as pipes_pkg
from episodepipes.pipes import BatchStacker, Decoder, EpisodeIndex, Item, ShardReader
from episodepipes.pipes._decode.buffers import consecutive_rows
from episodepipes.pipes._decode.mapped import ShardSlice
from episodepipes.pipes.train import TrainReader

PROBES = {"hasattr", "getattr", "isinstance", "callable"}
# names a node's neighbours go by: its upstream, a reader or decoder it was given, a graph's root
NEIGHBOURS = {"source", "sources", "upstream", "node", "root", "_root", "reader", "readers", "decoder", "dec"}
# (module, function, what is probed) -> why it is not a side channel
ALLOWED = {
    ("_decode/lifecycle.py", "shutdown_node", "node"):
        "shutdown() is torchdata's optional release hook, not on BaseNode: a node without one owns nothing",
    ("read.py", "_local_members", "self.source"):
        "ShardReader.source is its byte Source (a local folder or a remote store), not an upstream node",
    ("pipe.py", "__init__", "root"):
        "Pipe(gated=True) checks the argument it is given is a Gate, and refuses it by name",
    ("normalize.py", "inverse", "source"):
        "PerSource.inverse's source is the batch's source names (one, or one per row), not a node",
}


def _probed(arg: ast.expr) -> str | None:
    """The neighbour an expression names (``self.source``, ``source``, ``self.readers[i]``), else None."""
    while isinstance(arg, ast.Subscript):
        arg = arg.value
    last = arg.attr if isinstance(arg, ast.Attribute) else arg.id if isinstance(arg, ast.Name) else None
    return ast.unparse(arg) if last in NEIGHBOURS else None


def _probes() -> set[tuple[str, str, str]]:
    root = Path(pipes_pkg.__file__).parent
    found = set()
    for path in sorted(root.rglob("*.py")):
        if path.parent.name == "order":  # pure orders, no nodes (a `node` there is one of the mixture's tree)
            continue
        tree = ast.parse(path.read_text(), str(path))
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for call in ast.walk(fn):
                if (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in PROBES
                        and call.args and (what := _probed(call.args[0])) is not None):
                    found.add((path.relative_to(root).as_posix(), fn.name, what))
    return found


def test_no_node_probes_a_neighbour_outside_the_listed_exceptions():
    found = _probes()
    assert found - set(ALLOWED) == set(), "pass the neighbour's interface from the builder (pipes/links.py)"
    assert set(ALLOWED) - found == set(), "an exception no longer needed: drop it from ALLOWED"


@pytest.fixture(scope="module")
def idx(tmp_path_factory):
    return EpisodeIndex.open(make_shards(tmp_path_factory.mktemp("links") / "s", num_episodes=2, length=6,
                                         height=16, width=24))


def _stacker(idx, *, wired):
    items = [Item(e.id, f) for e in idx.episodes for f in range(e.length)]
    dec = Decoder(ShardReader(idx, items), idx, num_workers=2)
    return BatchStacker(dec, batch_size=4, rows=dec if wired else None), dec


@pytest.mark.parametrize("wired", [False, True])
def test_a_decoder_lays_samples_out_in_batch_rows_only_when_its_stacker_is_wired_to_it(idx, wired):
    _, dec = _stacker(idx, wired=wired)
    dec.reset(None)
    assert (consecutive_rows([next(dec)["front"] for _ in range(4)]) is not None) == wired
    dec.shutdown()


def test_a_hand_built_graph_without_links_gives_the_same_batches(idx):
    plain, wired = (list(_stacker(idx, wired=w)[0]) for w in (False, True))
    assert len(plain) == len(wired) == 3
    for a, b in zip(plain, wired):
        assert a["episode"] == b["episode"] and a["frame"].tolist() == b["frame"].tolist()
        np.testing.assert_array_equal(a["front"].numpy(), b["front"].numpy())


def _reader(idx):
    return TrainReader(idx, idx.split("train"), windows={}, seed=0, rank=0, world_size=1, batch_size=2, epochs=1)


@pytest.mark.parametrize("wired", [False, True])
def test_a_process_decoder_has_its_reader_send_slices_only_when_wired(idx, wired):
    reader = _reader(idx)
    Decoder(reader, idx, method="process", slices=reader.send_slices if wired else None)
    reader.reset(None)
    raw = next(reader)
    assert isinstance(raw.members["front.jpg"], ShardSlice) == wired
    reader.close()


def test_a_decoder_resumes_the_same_with_or_without_its_readers_cursor(idx):
    def run(cursor, state=None):
        reader = _reader(idx)
        dec = Decoder(reader, idx, num_workers=2, cursor=reader if cursor else None)
        dec.reset(state)
        return dec

    for cursor in (False, True):
        dec = run(cursor)
        head = [next(dec)["frame"] for _ in range(3)]
        state = dec.state_dict()
        dec.shutdown()
        assert head and [s["frame"] for s in run(cursor, state)] == [s["frame"] for s in run(cursor)][3:]


def test_a_cursor_that_is_not_the_source_is_refused(idx):
    with pytest.raises(ValueError, match="cursor= should be the source node itself"):
        Decoder(_reader(idx), idx, cursor=_reader(idx))
