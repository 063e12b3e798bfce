import shutil

import pytest
from helpers import as_v1, make_shards

from episodepipes.pipes import EpisodeIndex


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    out = make_shards(tmp_path_factory.mktemp("idx") / "s", num_episodes=5, length=15, height=32, width=48,
                      shard_size=50_000)
    return EpisodeIndex.open(out)


@pytest.fixture(scope="module")
def v1_root(index, tmp_path_factory):
    return as_v1(shutil.copytree(index.root, tmp_path_factory.mktemp("v1") / "s"))


def test_frame_ranges_tile_each_episode_across_shards(index):
    spanning = [e for e in index.episodes if len(e.segments) > 1]
    assert spanning, "the fixture should make an episode span two shards"
    for ep in index.episodes:
        ranges = [ep.frame_range(f) for f in range(ep.length)]
        for (s0, _, b0), (s1, a1, _) in zip(ranges, ranges[1:]):
            assert s1 > s0 or a1 == b0  # contiguous within a shard, or the next shard starts
        assert sum(b - a for _, a, b in ranges) == ep.nbytes
    with pytest.raises(IndexError, match="outside episode"):
        index.episodes[0].frame_range(15)


def test_unknown_episode_names_close_matches(index):
    with pytest.raises(KeyError, match=r"close matches: \['ep0003'"):
        index.episode("ep003")


def test_episode_lookups_by_id_stay_right_past_the_remembered_ids(index, monkeypatch):
    from episodepipes.index import episode_index

    monkeypatch.setattr(episode_index, "RECENT", 2)  # the memo fills and is cleared every other lookup
    ids = list(index.ids)
    for eid in ids + ids[::-1] + ids:
        ep = index.episode(eid)
        assert ep.id == eid and index.episodes[index.numbers([eid])[0]] is ep
    for bad in ("nope", "", "ep0000\0", 7):
        with pytest.raises(KeyError, match="is not in"):
            index.episode(bad)
    assert index.episode(ids[1]).id == ids[1]  # a miss remembers nothing


def test_verify_checks_only_the_given_shards(index, tmp_path):
    import shutil

    copy = shutil.copytree(index.root, tmp_path / "s")
    (copy / index.shards[-1].name).write_bytes(b"oops")
    bad = EpisodeIndex.open(copy)
    bad.verify(shards=[0])
    with pytest.raises(ValueError, match=index.shards[-1].name):
        bad.verify(shards=[0, len(index.shards) - 1])


def test_splits(index):
    assert [e.id for e in index.split("val")] == ["ep0002"]
    assert len(index.split("train")) == 4


@pytest.mark.parametrize("damage", [
    lambda d: [d],  # not an object at all
    lambda d: {**d, "episodes": [{**d["episodes"][0], "segments": [
        {k: v for k, v in d["episodes"][0]["segments"][0].items() if k != "count"}]}]},
    lambda d: {**d, "episodes": [{**d["episodes"][0], "cameras": {"front": {"width": 48}}}]},
    lambda d: {**d, "episodes": [{**d["episodes"][0], "fps": "fast"}]},
])
def test_a_damaged_index_is_named_not_a_raw_python_error(v1_root, tmp_path, damage):
    import json

    data = json.loads((v1_root / "index.json").read_text())
    (tmp_path / "index.json").write_text(json.dumps(damage(data)))
    with pytest.raises(ValueError, match=r"index\.json.*(damaged|not an episodepipes)"):
        EpisodeIndex.open(tmp_path)


def _rewrite(root, tmp_path, change):
    """A v1 copy of ``root`` with ``change`` applied to its JSON."""
    import json

    copy = as_v1(shutil.copytree(root, tmp_path / "copy"))
    data = json.loads((copy / "index.json").read_text())
    change(data)
    (copy / "index.json").write_text(json.dumps(data))
    return copy


def test_every_frame_crc_is_the_crc32_of_its_byte_range(index):
    import zlib

    for ep in index.episodes:
        for f in range(ep.length):
            shard, a, b = ep.frame_range(f)
            assert ep.frame_crc(f) == zlib.crc32(index.shard_path(shard).read_bytes()[a:b])
    assert all(s.crc32 is not None and len(s.crc32) == s.count for e in index.episodes for s in e.segments)
    with pytest.raises(IndexError, match="outside episode"):
        index.episodes[0].frame_crc(-1)


def test_an_index_without_crcs_gives_none(index, tmp_path):
    def old(data):
        for e in data["episodes"]:
            for s in e["segments"]:
                del s["crc32"]

    assert EpisodeIndex.open(_rewrite(index.root, tmp_path, old)).episodes[0].frame_crc(0) is None


def test_an_index_without_source_sizes_gives_the_stored_size(index, tmp_path):
    def old(data):
        for e in data["episodes"]:
            for c in e["cameras"].values():
                del c["source_height"], c["source_width"]

    cams = EpisodeIndex.open(_rewrite(index.root, tmp_path, old)).episodes[0].cameras
    assert {(c.height, c.width, c.source_height, c.source_width) for c in cams.values()} == {(32, 48, 32, 48)}


def test_resize_keeps_each_cameras_source_size(tmp_path):
    from episodepipes.sharding.formats.synthetic import SyntheticReader
    from episodepipes.sharding.write.encode import EncodeOptions, encode_episode
    from episodepipes.sharding.write.writer import ShardWriter

    reader = SyntheticReader(num_episodes=1, length=3, height=40, width=64)
    with ShardWriter(tmp_path / "s", shard_size=1 << 20, options={}) as w:
        w.add(encode_episode(reader.read("ep0000"), EncodeOptions(resize=(20, 24))))
    cams = EpisodeIndex.open(tmp_path / "s").episodes[0].cameras
    assert {(c.height, c.width, c.source_height, c.source_width) for c in cams.values()} == {(20, 24, 40, 64)}


def test_old_dtype_names_are_normalised_to_full_dtype_strings(index, tmp_path):
    def old(data):
        for e in data["episodes"]:
            for a in e["arrays"].values():
                assert a["dtype"] == "<f4"
                a["dtype"] = "float32"  # dtype.name, as writers before byte orders recorded it

    arrays = EpisodeIndex.open(_rewrite(index.root, tmp_path, old)).episodes[0].arrays
    assert {a.dtype for a in arrays.values()} == {"<f4"}


def test_fingerprint_is_the_sha256_of_the_index_bytes(index, tmp_path):
    import hashlib

    assert index.fingerprint == hashlib.sha256((index.root / "index.json").read_bytes()).hexdigest()
    assert EpisodeIndex.open(index.root).fingerprint == index.fingerprint
    other = _rewrite(index.root, tmp_path, lambda d: d["episodes"][0].update(prompt="other"))
    same = _rewrite(index.root, tmp_path / "b", lambda d: None)
    assert EpisodeIndex.open(other).fingerprint != EpisodeIndex.open(same).fingerprint


def test_verify_names_the_frame_whose_bytes_fail_their_crc32_even_with_a_matching_sha256(index, tmp_path):
    import hashlib
    import json
    import shutil

    from episodepipes.sharding.inspect import verify

    copy = shutil.copytree(index.root, tmp_path / "s")
    ep = index.episodes[1]
    shard, a, _ = ep.frame_range(4)
    path = copy / index.shards[shard].name
    blob = bytearray(path.read_bytes())
    blob[a + 512 + 130] ^= 0x01  # inside the first member's payload: the tar headers still parse
    path.write_bytes(bytes(blob))
    problems = verify(copy)
    assert f"shard {path.name}: crc32 mismatch in 1 frames, the first episode {ep.id!r} frame 4" in "\n".join(problems)
    assert sum("crc32" in p for p in problems) == 1
    as_v1(copy)
    data = json.loads((copy / "index.json").read_text())
    data["shards"][shard]["sha256"] = hashlib.sha256(bytes(blob)).hexdigest()  # the index re-hashed to match
    (copy / "index.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match=rf"crc32 mismatch in 1 frames, the first episode '{ep.id}' frame 4"):
        EpisodeIndex.open(copy, verify=True)
    assert [p for p in verify(copy) if "crc32" in p] and not [p for p in verify(copy) if "sha256" in p]
