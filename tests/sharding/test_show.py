"""``episodepipes-shard show``: the page holds each shown episode as stored (arrays, a video per camera at the
source fps), the dataset's view, every dataset text escaped; it reads only the shown episodes' frames (counted in
bytes and shards, locally and on S3 through a counting proxy); caps and errors name their option."""

from __future__ import annotations

import base64
import html
import io
import json
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from html.parser import HTMLParser
from pathlib import Path

import av
import numpy as np
import pytest
from showdata import HOSTILE, hostile_split, write

from episodepipes.index import EpisodeIndex
from episodepipes.sharding.cli import main
from episodepipes.sharding.formats.synthetic import SyntheticReader
from episodepipes.sharding.show import MAX_EPISODES, default_page, show

SHAPE = dict(num_episodes=6, lengths=(14, 9, 12, 7, 10, 8), height=48, width=64, fps=10.0)
SOURCE = SyntheticReader(**SHAPE)


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> dict[str, Path]:
    """The same episodes as JPEG (members layout, several shards) and as h264 and AV1 (packed layout)."""
    base = tmp_path_factory.mktemp("show")
    return {codec: write(base / codec, codec=codec, shard_size=40_000, **SHAPE) for codec in ("jpeg", "h264", "av1")}


def page_data(page: Path) -> tuple[str, dict]:
    """(the page's text, the JSON it carries for its script)."""
    text = page.read_text("utf-8")
    got = re.search(r'<script type="application/json" id="episodepipes-data">(.*?)</script>', text, re.S)
    assert got is not None
    return text, json.loads(got.group(1))


def page_videos(text: str) -> list[dict[str, bytes]]:
    """Per episode section, camera -> its mp4's bytes."""
    out = []
    for section in re.findall(r'<section class="episode".*?</section>', text, re.S):
        out.append({html.unescape(c): base64.b64decode(d) for c, d in
                    re.findall(r'data-camera="([^"]*)" src="data:video/mp4;base64,([A-Za-z0-9+/=]*)"', section)})
    return out


def decoded(mp4: bytes) -> tuple[list[np.ndarray], float, str, bool]:
    """(RGB frames, frame rate, codec, whether the index (moov) comes before the frames (mdat))."""
    with av.open(io.BytesIO(mp4)) as c:
        s = c.streams.video[0]
        frames = [f.to_ndarray(format="rgb24") for f in c.decode(s)]
        return frames, float(s.average_rate), s.codec_context.name, mp4.find(b"moov") < mp4.find(b"mdat")


def values(v: list | dict) -> np.ndarray:
    """A figure's numbers: a JSON list, or plotly's typed array (``{"dtype", "bdata"}``, base64 of the values)."""
    if isinstance(v, dict):
        return np.frombuffer(base64.b64decode(v["bdata"]), np.dtype(v["dtype"]))
    return np.array(v, dtype=float)


def lines(fig: dict) -> np.ndarray:
    """A figure's lines as columns: ``(frames, lines)``."""
    return np.stack([values(tr["y"]) for tr in fig["data"]], axis=1)


def shown_bytes(index: EpisodeIndex, ids: list[str], frames: int | None = None) -> tuple[int, set[str]]:
    """The bytes of the first ``frames`` frames of each episode, and the shards they are in."""
    total, shards = 0, set()
    for eid in ids:
        ep = index.episode(eid)
        n = ep.length if frames is None else min(frames, ep.length)
        s, a, b = index.frame_ranges(np.arange(ep.rows.start, ep.rows.start + n))
        total += int((b - a).sum())
        shards |= {index.shards[k].name for k in set(s.tolist())}
    return total, shards


@pytest.mark.parametrize("codec", ["jpeg", "h264", "av1"])
def test_the_page_holds_each_episode_as_stored(datasets, tmp_path, codec):
    ids = ["ep0002", "ep0000"]
    res = show(datasets[codec], ids, page_path=tmp_path / "p.html")
    assert res.episodes == ids and res.frames == [12, 14] and res.page == tmp_path / "p.html"
    text, data = page_data(res.page)
    videos = page_videos(text)
    assert [len(v) for v in videos] == [2, 2]
    for k, eid in enumerate(ids):
        src = SOURCE.read(eid)
        plots = data["episodes"][k]["plots"]
        assert data["episodes"][k]["fps"] == 10.0 and data["episodes"][k]["frames"] == src.arrays["state"].shape[0]
        by_name = {p["figure"]["layout"]["title"]["text"]: p["figure"] for p in plots}
        assert sorted(by_name) == ["action", "keypoints", "state"]
        for name, fig in by_name.items():  # every element of every array, exactly as written, against seconds
            want = src.arrays[name].reshape(len(src.arrays[name]), -1)
            names = ["keypoints[0,0]", "keypoints[0,1]"] if name == "keypoints" else [f"{name}[{j}]" for j in range(7)]
            assert [tr["name"] for tr in fig["data"]] == names
            np.testing.assert_array_equal(lines(fig), want)
            np.testing.assert_allclose(values(fig["data"][0]["x"]), np.arange(len(want)) / 10.0)
            assert fig["layout"]["shapes"][0]["x0"] == 0  # the cursor, which the page's script moves
        for cam, frames_src in src.cameras.items():
            frames, fps, name, faststart = decoded(videos[k][cam])
            assert (len(frames), fps, name, faststart) == (len(src.arrays["state"]), 10.0, "h264", True)
            source = [f.astype(int) for f in frames_src]
            for t, got in enumerate(frames):  # lossy twice (the shard's codec, then H.264): close, and in order
                errors = [np.abs(got.astype(int) - f).mean() for f in source]
                assert int(np.argmin(errors)) == t and errors[t] < 16
    assert "episode ep0002" in text and "ep0001" not in text  # named episodes only, in the order named


def test_only_the_shown_episodes_frames_are_read(datasets, tmp_path):
    out = datasets["jpeg"]
    index = EpisodeIndex.open(out)
    ids = ["ep0004", "ep0001"]
    want, shards = shown_bytes(index, ids)
    assert len(index.shards) > len(shards) >= 1  # the dataset has shards these episodes are not in
    res = show(out, ids, page_path=tmp_path / "a.html")
    assert (res.counts.bytes, res.counts.shards) == (want, shards)
    assert res.counts.reads == sum(len(ep.segments) for ep in map(index.episode, ids))  # a read per run of frames
    cut = show(out, ids, page_path=tmp_path / "cut.html", max_frames=3)
    assert (cut.counts.bytes, cut.frames) == (shown_bytes(index, ids, 3)[0], [3, 3])
    assert "2 episodes shown up to frame 3 (--max-frames 3; raise it to see more)" in cut.page.read_text()
    alone = tmp_path / "alone"  # a copy without any shard the episodes are not in gives the same page
    shutil.copytree(out, alone)
    for s in index.shards:
        if s.name not in shards:
            (alone / s.name).unlink()
    again = show(alone, ids, page_path=tmp_path / "b.html")
    assert page_data(again.page)[1] == page_data(res.page)[1]
    assert page_videos(again.page.read_text()) == page_videos(res.page.read_text())


def test_a_packed_episode_of_several_chunks_is_one_read(tmp_path):
    out = write(tmp_path / "long", codec="h264", num_episodes=2, length=150, height=16, width=24)
    index = EpisodeIndex.open(out)
    ep = index.episode("ep0001")
    assert len(set(index.tables.columns["member"][ep.rows.start:ep.rows.stop].tolist())) >= 2  # chunks
    res = show(out, ["ep0001"], page_path=tmp_path / "p.html")
    first, last = ep.frame_range(0), ep.frame_range(ep.length - 1)
    frames_only, _ = shown_bytes(index, ["ep0001"])
    # the episode's records and the chunks' framing between them, and nothing of ep0000 before it
    assert (res.counts.reads, res.counts.bytes) == (1, last[2] - first[1])
    assert frames_only < res.counts.bytes < frames_only + 2048 * 3


def test_the_dataset_view_comes_from_the_index_and_its_statistics(datasets, tmp_path):
    out = datasets["h264"]
    index = EpisodeIndex.open(out)
    res = show(out, page_path=tmp_path / "p.html")
    assert res.episodes == [f"ep{k:04d}" for k in range(MAX_EPISODES)]  # the default cap, in index order
    text, data = page_data(res.page)
    assert f"{MAX_EPISODES} of 6 episodes shown (the first {MAX_EPISODES} in index order; name episodes as " \
           "EPISODE arguments, or raise --max-episodes)" in text
    splits = data["summary"]["splits"]["data"][0]
    assert dict(zip(splits["x"], splits["y"])) == {"train": 4, "val": 2}
    assert splits["customdata"] == [sum(SHAPE["lengths"][k] for k in (0, 1, 3, 4)), SHAPE["lengths"][2] +
                                    SHAPE["lengths"][5]]
    lengths = data["summary"]["lengths"]["data"]
    assert [tr["name"] for tr in lengths] == ["train", "val"] and sum(sum(tr["y"]) for tr in lengths) == 6
    dists = {f["layout"]["title"]["text"].split(":")[0]: f for k, f in data["summary"].items() if k.startswith("dist")}
    assert sorted(dists) == ["action", "keypoints", "state"]
    box = dists["state"]["data"][0]
    st = index.stats("state", box["name"])
    for field, key in (("lowerfence", "q01"), ("q1", "q10"), ("median", "q50"), ("q3", "q90"), ("upperfence", "q99"),
                       ("mean", "mean"), ("sd", "std")):
        np.testing.assert_allclose(values(box[field]), st[key])
    assert "codecs" in text and "front 48x64 h264 gop 4" in text  # each camera's codec, per episode too


def test_an_index_without_statistics_says_how_to_add_them(shard_folder, tmp_path):
    out = shard_folder("show-nostats", num_episodes=2, length=5, height=16, width=24)
    assert EpisodeIndex.open(out).stats_keys() is None
    text, data = page_data(show(out, page_path=tmp_path / "p.html").page)
    assert "<code>episodepipes-shard stats OUT --recompute</code> adds them" in text
    assert not [k for k in data["summary"] if k.startswith("dist")]


class Tags(HTMLParser):
    """Every element and attribute name of a page, as a browser's parser meets them."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: set[str] = set()
        self.attrs: set[str] = set()
        self.comments = 0

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self.tags.add(tag)
        self.attrs |= {k for k, _ in attrs}

    def handle_comment(self, data: str) -> None:
        self.comments += 1


def test_every_dataset_text_is_escaped(tmp_path):
    out = write(tmp_path / "hostile", hostile=True, num_episodes=3, length=6, height=16, width=24)
    split = hostile_split(out)
    text, data = page_data(show(out, page_path=tmp_path / "p.html").page)
    parsed = Tags()
    parsed.feed(text)
    # the page's own elements and attributes only: no image, no handler, no comment, three scripts
    assert parsed.tags <= {"html", "head", "meta", "title", "style", "script", "body", "h1", "h2", "h3", "table", "tr",
                           "th", "td", "p", "code", "div", "section", "figure", "video", "figcaption", "button",
                           "input", "span"}
    assert not [a for a in parsed.attrs if a.startswith("on")] and parsed.comments == 0
    assert len(re.findall(r"<script", text)) == 3
    for shown in (f"prompt {HOSTILE}", f"state {HOSTILE}", split, "attribute <b>key</b>",
                  json.dumps(HOSTILE, ensure_ascii=False)):  # shown as text, whole
        assert html.escape(shown) in text
    assert data["summary"]["lengths"]["data"][1]["name"].startswith("val &lt;/script&gt;&lt;script&gt;")  # plotly's
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]*)"', text).group(1)
    assert csp.startswith("default-src 'none'; script-src 'sha256-") and csp.count("'sha256-") == 2


def test_an_id_that_is_not_in_the_index_is_refused_in_one_line(datasets, tmp_path, capsys):
    out = datasets["jpeg"]
    assert main(["show", str(out), "<script>alert(1)</script>", "--page", str(tmp_path / "p.html")]) == 2
    err = capsys.readouterr().err
    assert err == (f"episodepipes-shard: error: episode '<script>alert(1)</script>' is not in {out}/index.json; "
                   "close matches: none\n")
    assert not (tmp_path / "p.html").exists()
    bad = tmp_path / "bad"  # an index whose id is HTML: refused when the index opens, naming the file
    shutil.copytree(out, bad)
    data = json.loads((bad / "index.json").read_text())  # the ids are a column (`episodepipes.index.idcols`)
    ids = np.load(bad / "index.ids.npy").astype("S32")
    ids[0] = b"<script>alert(1)</script>"
    np.save(bad / "index.ids.npy", ids)
    data["columns"]["ids"].update(dtype=ids.dtype.str)
    (bad / "index.json").write_text(json.dumps(data))
    assert main(["show", str(bad), "--page", str(tmp_path / "p.html")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"episodepipes-shard: error: {bad}/index.json") and "not a tar-safe episode id" in err
    assert err.count("\n") == 1 and not (tmp_path / "p.html").exists()


@pytest.mark.parametrize("args, message", [
    (["--max-frames", "0"], "--max-frames 0 must be >= 1"),
    (["--max-episodes", "0"], "--max-episodes 0 must be >= 1"),
    (["ep0000", "ep0001", "ep0002", "--max-episodes", "2"],
     "3 episodes asked for, more than --max-episodes 2 (each one's videos go into the page); pass --max-episodes 3 "
     "to show them all"),
    (["--port", "9"], "--port 9 applies to --serve only; add --serve or drop --port"),
    (["--serve", "--port", "70000"], "--port 70000 must be within 0..65535 (0: any free port)"),
])
def test_bad_options_are_one_line_errors(datasets, tmp_path, capsys, args, message):
    assert main(["show", str(datasets["jpeg"]), *args, "--page", str(tmp_path / "p.html")]) == 2
    assert capsys.readouterr().err == f"episodepipes-shard: error: {message}\n"


def test_the_page_is_written_safely(datasets, tmp_path, capsys, monkeypatch):
    target = tmp_path / "elsewhere.html"
    (tmp_path / "p.html").symlink_to(target)  # a planted link is replaced, its target never written
    assert main(["show", str(datasets["jpeg"]), "ep0000", "--page", str(tmp_path / "p.html")]) == 0
    assert not target.exists() and not (tmp_path / "p.html").is_symlink()
    assert capsys.readouterr().out.startswith(f"wrote {tmp_path / 'p.html'} (")
    assert main(["show", str(tmp_path / "missing"), "--page", str(tmp_path / "q.html")]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    monkeypatch.chdir(tmp_path)  # by default, beside the user, named after the dataset; never inside it
    assert default_page("s3://bucket/some/data/") == Path("data.html")
    assert main(["show", str(datasets["jpeg"]), "ep0000"]) == 0
    assert (tmp_path / "jpeg.html").is_file() and not list(datasets["jpeg"].glob("*.html"))


def test_a_damaged_frame_is_a_listed_gap(datasets, tmp_path, caplog):
    out = tmp_path / "damaged"
    shutil.copytree(datasets["h264"], out)
    index = EpisodeIndex.open(out)
    shard, a, b = index.episode("ep0000").frame_range(3)
    with open(out / index.shards[shard].name, "r+b") as f:
        f.seek((a + b) // 2)
        byte = f.read(1)
        f.seek((a + b) // 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    res = show(out, ["ep0000"], page_path=tmp_path / "p.html")
    text, data = page_data(res.page)
    assert "frame 3: its bytes do not match the index&#x27;s crc32" in text
    assert "episode 'ep0000':" in caplog.text and "episodepipes-shard verify" in caplog.text
    state = lines(data["episodes"][0]["plots"][2]["figure"])
    assert np.isnan(state[3]).all() and not np.isnan(np.delete(state, 3, axis=0)).any()  # a gap in the lines
    frames, *_ = decoded(page_videos(text)[0]["front"])
    assert len(frames) == 14 and np.abs(frames[3].astype(int) - 128).mean() < 3  # grey where it is damaged


def test_a_remote_root_reads_only_the_shown_episodes(moto, proxy, datasets, tmp_path, capsys):
    out = datasets["h264"]
    moto.upload_dir(out, "show", "data")
    proxy.reset()
    assert main(["show", "s3://show/data", "ep0003", "--page", str(tmp_path / "remote.html")]) == 0
    index = EpisodeIndex.open(out)
    ep = index.episode("ep0003")
    shard_gets = [(p, r) for _, p, r in proxy.gets() if p.endswith(".tar")]
    assert {p.rsplit("/", 1)[-1] for p, _ in shard_gets} == {index.shards[s.shard].name for s in ep.segments}
    spans = [tuple(map(int, r.removeprefix("bytes=").split("-"))) for _, r in shard_gets]
    got = sum(b - a + 1 for a, b in spans)
    assert got == shown_bytes(index, ["ep0003"])[0]  # the episode's records, one range per run of them
    assert f"read {got} bytes of 1 shards" in capsys.readouterr().out
    local = show(out, ["ep0003"], page_path=tmp_path / "local.html")
    assert page_data(local.page)[1] == page_data(tmp_path / "remote.html")[1]
    assert page_videos(local.page.read_text()) == page_videos((tmp_path / "remote.html").read_text())


def test_serve_serves_the_page_on_localhost_only(datasets, tmp_path):
    page = tmp_path / "p.html"
    cmd = [sys.executable, "-m", "episodepipes.sharding.cli", "show", str(datasets["jpeg"]), "ep0001", "--page",
           str(page), "--serve", "--port", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().startswith(f"wrote {page} (")
        line = proc.stdout.readline()
        url = re.fullmatch(r"serving .* at (http://127\.0\.0\.1:\d+/) \(Ctrl-C stops\)\n", line).group(1)
        with urllib.request.urlopen(url) as r:
            assert r.read() == page.read_bytes() and r.headers["Content-Type"] == "text/html; charset=utf-8"
        with pytest.raises(urllib.error.HTTPError, match="404"):
            urllib.request.urlopen(url + "index.json")  # only the page: nothing of the dataset or the folder
    finally:
        proc.terminate()
        proc.wait()
