"""Every public node passes torchdata's own save/load contract (`run_test_save_load_state`, copied unchanged)."""

from __future__ import annotations

import pytest
from helpers import make_shards
from nodes_contract import Exact, run_test_save_load_state

from episodepipes.pipes import BatchStacker, Decoder, EpisodeIndex, Gate, ShardReader, train_pipe
from episodepipes.pipes.plan import Item

ITEMS = [Item(e, f) for e in ("ep0002", "ep0000") for f in range(7)] + [Item("ep0001", 3, False)]


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    out = make_shards(tmp_path_factory.mktemp("contract") / "s", num_episodes=3, length=7, height=16, width=24,
                      shard_size=20_000)
    return EpisodeIndex.open(out)


def _decoder(index, method):
    return Decoder(ShardReader(index, ITEMS), index, method=method, num_workers=2)


def _stacker(index):
    dec = _decoder(index, "thread")
    return BatchStacker(dec, batch_size=4, rows=dec)  # as the builders wire it: frames decoded into batch rows


NODES = {
    "reader": lambda index: ShardReader(index, ITEMS),
    "decoder-threads": lambda index: _decoder(index, "thread"),
    "decoder-processes": lambda index: _decoder(index, "process"),
    "stacker": _stacker,
    "open-gate": lambda index: Gate(lambda: _stacker(index)),
}


@pytest.mark.parametrize("midpoint", [0, 2])
@pytest.mark.parametrize("node", NODES)
def test_node_follows_torchdatas_save_load_contract(index, node, midpoint):
    run_test_save_load_state(Exact(), NODES[node](index), midpoint)


@pytest.mark.parametrize("method, midpoint", [("thread", 0), ("thread", 3), ("process", 2)])
def test_train_pipe_root_follows_torchdatas_save_load_contract(index, method, midpoint):
    root = train_pipe(index, batch_size=3, seed=1, rank=0, world_size=1, num_workers=2, method=method,
                      history={"state": 2}, horizon={"action": 2})._root
    run_test_save_load_state(Exact(), root, midpoint)
