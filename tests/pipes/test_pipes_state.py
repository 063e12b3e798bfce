import pytest
from helpers import make_shards

from episodepipes.pipes import BatchStacker, Decoder, EpisodeIndex, Gate, ShardReader, video_pipe
from episodepipes.pipes.plan import Item


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    out = make_shards(tmp_path_factory.mktemp("state") / "s", num_episodes=3, length=9, height=16, width=24,
                      shard_size=20_000)
    return EpisodeIndex.open(out)


def _key(x):
    """A comparable view of whatever a node yields."""
    if isinstance(x, dict) and "episode" in x and not isinstance(x["episode"], str):
        return list(zip(x["episode"], x["frame"].tolist(), x["front"].sum((1, 2, 3)).tolist()))
    if isinstance(x, dict):
        return (x["episode"], x["frame"], int(x["front"].sum()))
    return (x.item, sorted(x.members))


def check_fresh_node_resumes(make_node, midpoints):
    """Save at each midpoint, restore into a fresh node, and check the rest of the pass is unchanged (torchdata's
    own contract, which restores into the same node across passes, is in tests/test_nodes_contract.py)."""
    node = make_node()
    node.reset()
    full = [_key(x) for x in node]
    for m in midpoints:
        node = make_node()
        node.reset()
        head = [_key(next(node)) for _ in range(m)]
        state = node.state_dict()
        tail = [_key(x) for x in node]
        assert head + tail == full
        fresh = make_node()
        fresh.reset(state)
        assert [_key(x) for x in fresh] == tail, m


ITEMS = [Item(e, f) for e in ("ep0002", "ep0000") for f in range(9)] + [Item("ep0001", 3, False)]


@pytest.mark.parametrize("midpoints", [[0, 1, 7, 18]])
def test_reader_state(index, midpoints):
    check_fresh_node_resumes(lambda: ShardReader(index, ITEMS), midpoints)


@pytest.mark.parametrize("method", ["thread", "process"])
def test_decoder_state_with_frames_in_flight(index, method):
    check_fresh_node_resumes(lambda: Decoder(ShardReader(index, ITEMS), index, method=method, prefetch=5),
                             [0, 2, 11, 19])


def test_gate_and_stacker_state(index):
    def make():
        def build():
            dec = Decoder(ShardReader(index, ITEMS), index)
            return BatchStacker(dec, batch_size=4, rows=dec)

        return Gate(build)

    check_fresh_node_resumes(make, [0, 1, 3, 5])


def test_pipe_state_round_trip(index):
    pipe = video_pipe(index, episodes=["ep0001", "ep0002"], batch_size=4, max_batches=5)
    full = [_key(b) for b in pipe]
    it = iter(pipe)
    head = [_key(next(it)) for _ in range(2)]
    state = pipe.state_dict()
    pipe.close()
    pipe.load_state_dict(state)
    assert head + [_key(b) for b in pipe] == full


@pytest.mark.parametrize("chunk, prefetch", [(3, 12), (8, None)])
def test_chunked_process_decoder_state(index, chunk, prefetch):
    """Samples sent to processes several per task (19 items: a partial chunk at the end) resume exactly."""
    def make():
        return Decoder(ShardReader(index, ITEMS), index, method="process", chunk=chunk, prefetch=prefetch)

    assert make().chunk == chunk
    check_fresh_node_resumes(make, [0, 1, 4, 11, 18])
    thread = Decoder(ShardReader(index, ITEMS), index)
    thread.reset()
    node = make()
    node.reset()
    assert [_key(x) for x in node] == [_key(x) for x in thread]
