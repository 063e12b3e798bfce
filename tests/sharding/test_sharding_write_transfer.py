"""How pooled encoders hand an episode's tar bytes to the writer: shared-memory slots, or a spool file when an
episode is larger than a slot. Either way the writer gets exactly the bytes an in-process encode gives."""

import hashlib
import io
import tarfile

import pytest

from episodepipes.sharding.formats.synthetic import SyntheticReader
from episodepipes.sharding.write import WriteOptions, write_shards
from episodepipes.sharding.write.encode import EncodeOptions
from episodepipes.sharding.write.encoders import encoded, samples

SYN = SyntheticReader(num_episodes=5, length=6, height=48, width=64, lengths=(6, 3, 9, 4, 7))


def _tasks(spool):
    return [(SYN, eid, None, False, EncodeOptions(), spool) for eid in SYN.episode_ids()]


def _taken(results, spool):
    """(meta, bytes, sizes) of each result, and whether it came as a spool file still on disk then."""
    out = []
    for res in results:
        assert res[0] == "ok", res
        spooled = isinstance(res[2][0], str) and (spool / f"{res[1]['id']}.samples").exists()
        with samples(res[2]) as (data, sizes):
            out.append((res[1], bytes(data), list(sizes), spooled))
    return out


@pytest.mark.parametrize("slot_bytes", [64 * 2**20, 40_000, 0])  # every episode fits; some do; none (spool)
def test_pooled_results_are_the_in_process_bytes_whatever_carries_them(tmp_path, slot_bytes):
    spool = tmp_path / "spool"
    spool.mkdir()
    ref = _taken(encoded(_tasks(None), 1), spool)
    got = _taken(encoded(_tasks(str(spool)), 2, slot_bytes=slot_bytes), spool)
    assert [r[:3] for r in got] == [r[:3] for r in ref]
    spooled = [r[3] for r in got]
    assert spooled == [len(r[1]) > slot_bytes for r in ref]  # a slot when it fits, else the episode's spool file
    assert 0 < sum(len(r[1]) > 40_000 for r in ref) < len(ref)  # the middle case has both kinds
    assert not list(spool.iterdir())  # every spool file is gone once taken


def test_a_slot_is_reused_only_after_its_result_was_taken(tmp_path):
    # 9 episodes through 2 workers' 4 slots: each slot carries several episodes in turn, and every result
    # still holds its own bytes when the writer reads it, although the encoders run ahead of it
    reader = SyntheticReader(num_episodes=9, length=4, height=32, width=32)
    tasks = [(reader, eid, None, False, EncodeOptions(), str(tmp_path)) for eid in reader.episode_ids()]
    want = [hashlib.sha256(r[2][0]).hexdigest() for r in encoded([(*t[:-1], None) for t in tasks], 1)]
    got = []
    for res in encoded(tasks, 2):
        assert isinstance(res[2][0], memoryview)  # a view of the slot, not a copy
        got.append(hashlib.sha256(res[2][0]).hexdigest())
    assert got == want


def test_shards_from_pooled_slots_are_the_tarfile_reference_bytes(tmp_path):
    # the pool's shards, byte for byte, as Python's tarfile writes the same members with the same metadata
    out = tmp_path / "out"
    write_shards(SYN, out, WriteOptions(format="synthetic", shard_size=50_000), workers=2)
    shards = sorted(out.glob("shard-*.tar"))
    assert len(shards) > 1
    for path in shards:
        raw = path.read_bytes()
        with tarfile.open(path) as tar:
            members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]
        ref = tmp_path / "ref.tar"
        with tarfile.open(ref, "w", format=tarfile.GNU_FORMAT) as tar:
            for m, data in members:
                info = tarfile.TarInfo(m.name)
                info.size, info.mtime, info.mode, info.uid, info.gid, info.uname, info.gname = (
                    len(data), 0, 0o644, 0, 0, "", "")
                tar.addfile(info, io.BytesIO(data))
        # tarfile pads the archive to a 10 KiB record; the shard ends at its two zero blocks
        assert ref.read_bytes()[:len(raw)] == raw and not ref.read_bytes()[len(raw):].strip(b"\0")
