"""The README's code runs and its claims hold: the data command, the custom graph, the custom reader, the id listing,
every builder argument in the table; the Lightning snippet is the checked file."""

import inspect
import json
import re
from pathlib import Path

import cv2
import numpy as np
import torch

from episodepipes.pipes import EpisodeIndex, metric_pipe, train_pipe, video_pipe
from episodepipes.sharding import SyntheticReader
from episodepipes.sharding.formats import readers

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README, flags=re.S)


def _block(marker: str) -> str:
    (code,) = [b for b in _blocks() if marker in b]
    return code


def _run(code: str, name: str, **scope: object) -> dict:
    exec(compile(code, f"README.md:{name}", "exec"), scope)
    return scope


def test_data_command_makes_the_shards_the_examples_read(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _run(_block("SyntheticReader(num_episodes=6)"), "data")
    index = EpisodeIndex.open("shards/")
    assert [e.id for e in index.episodes] == [f"ep{i:04d}" for i in range(6)]
    assert [e.id for e in index.split("val")] == ["ep0002", "ep0005"]  # the pinned ids of the Lightning snippet
    assert {e.length for e in index.episodes} == {40}
    assert {(c.name, c.height, c.width) for c in index.episode("ep0002").cameras.values()} == {
        ("front", 96, 128), ("wrist", 96, 128)}


def test_custom_graph_example_runs_on_the_readme_data_and_transforms_before_batching(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _run(_block("SyntheticReader(num_episodes=6)"), "data")
    code = _block("Gate(build").replace("    ...", "    batches.append(batch)")
    batches = _run(code, "custom-graph", batches=[])["batches"]
    assert [len(b["episode"]) for b in batches] == [8] * 5  # ep0002's 40 frames, in order
    assert {e for b in batches for e in b["episode"]} == {"ep0002"}
    assert torch.cat([b["frame"] for b in batches]).tolist() == list(range(40))
    assert batches[0]["front"].shape[-2:] == (48, 64) and batches[0]["wrist"].shape[-2:] == (96, 128)


def test_info_episodes_lists_ids_splits_and_lengths(tmp_path, monkeypatch, capsys):
    # "`episodepipes-shard info --episodes shards/` also lists every episode id with its split, length and task"
    from episodepipes.sharding.cli import main

    assert "episodepipes-shard info --episodes shards/" in README
    monkeypatch.chdir(tmp_path)
    _run(_block("SyntheticReader(num_episodes=6)"), "data")
    assert main(["info", "--episodes", "shards/"]) == 0
    out = capsys.readouterr().out
    index = EpisodeIndex.open("shards/")
    for e in index.episodes:
        line = next(ln for ln in out.splitlines() if e.id in ln.split())
        assert e.split in line.split() and str(e.length) in line.split(), line


def test_demo_data_is_what_the_readme_says():
    # "9 generated episodes, ep0000 to ep0008 ... with ep0002, ep0005 and ep0008 in val"
    assert "SyntheticReader(num_episodes=9," in (ROOT / "scripts" / "demo.py").read_text()
    r = SyntheticReader(num_episodes=9)
    assert [e for e in r.episode_ids() if r.read(e).split == "val"] == ["ep0002", "ep0005", "ep0008"]
    assert "`ep0000` to `ep0008`" in README and "`ep0002`, `ep0005` and `ep0008` in `val`" in README


def test_custom_reader_example_registers_and_writes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(readers, "FORMATS", dict(readers.FORMATS))  # the example registers "npy": keep it local
    (tmp_path / "npy_src").mkdir()
    rng = np.random.default_rng(0)
    for eid, n in (("a", 5), ("b", 3)):
        np.save(tmp_path / "npy_src" / f"{eid}.npy", rng.integers(0, 255, (n, 32, 48, 3), dtype=np.uint8))
    _run(_block("register_format("), "custom-reader")
    index = EpisodeIndex.open("npy_shards/")
    assert [(e.id, e.split, e.length) for e in index.episodes] == [("a", "train", 5), ("b", "val", 3)]
    assert (index.episode("a").cameras["front"].height, index.episode("a").cameras["front"].width) == (32, 48)
    assert index.data["options"]["format"] == "npy"
    batch = next(iter(video_pipe(index, episodes=["b"], batch_size=3, max_batches=1)))
    assert batch["step"].flatten().tolist() == [0.0, 1.0, 2.0]


def test_hydra_example_builds_the_pipe_only_in_val_dataloader(tmp_path, monkeypatch):
    import functools
    import importlib

    import yaml

    monkeypatch.chdir(tmp_path)
    _run(_block("SyntheticReader(num_episodes=6)"), "data")
    (conf,) = re.findall(r"```yaml\n(.*?)```", README, flags=re.S)
    cfg = yaml.safe_load(conf)["data"]["val_pipe"]
    module, name = cfg.pop("_target_").rsplit(".", 1)
    assert cfg.pop("_partial_") is True
    target = getattr(importlib.import_module(module), name)
    assert set(cfg) <= set(inspect.signature(target).parameters)
    # what Hydra's instantiate returns for `_partial_: true`: the target with its arguments, not yet called
    data = _run(_block("self.val_pipe()"), "hydra")["MyData"](functools.partial(target, **cfg))
    assert isinstance(data.val_pipe, functools.partial)
    loaders = data.val_dataloader()
    assert loaders.names == ["val"] and loaders.lengths() == [1]  # 2 val episodes x 8 frames, batch_size 32


def _argument_table() -> dict[str, set[str]]:
    section = README.split("## Builder arguments\n", 1)[1].split("\n## ", 1)[0]
    by_builder: dict[str, set[str]] = {"metric": set(), "video": set(), "train": set()}
    for row in re.findall(r"^\| (`.*?) \| (.*?) \|", section, flags=re.M):
        for builder in (b.strip() for b in row[1].split(",")):
            by_builder[builder] |= set(re.findall(r"`(\w+)`", row[0]))
    return by_builder


def test_readme_documents_every_builder_argument_and_no_other():
    table = _argument_table()
    for key, fn in (("metric", metric_pipe), ("video", video_pipe), ("train", train_pipe)):
        assert table[key] == set(inspect.signature(fn).parameters), f"README's Builder arguments vs {fn.__name__}"


def test_lightning_snippet_is_the_private_api_checked_example_file():
    example = (ROOT / "docs" / "lightning_example.py").read_text()
    body = example.split("\n", 1)[1].strip()  # the file's first line is a comment heading
    assert any(b.strip() == body for b in _blocks()), "README snippet != docs/lightning_example.py"


def _cli_synopsis() -> str:
    section = README.split("## CLI\n", 1)[1].split("\n## ", 1)[0]
    return section.split("```\n", 2)[1]


def test_cli_synopsis_lists_every_write_option_and_no_other():
    from episodepipes.sharding import cli

    write = next(a for a in cli._parser()._subparsers._group_actions[0].choices.items() if a[0] == "write")[1]
    flags = {s for a in write._actions for s in a.option_strings if s.startswith("--") and s != "--help"}
    synopsis = _cli_synopsis().split("episodepipes-shard info", 1)[0]
    assert set(re.findall(r"--[a-z][a-z-]*", synopsis)) == flags


def _digits_as_n(text: str) -> str:
    return re.sub(r"\d+(\.\d+)?", "N", text)


def test_readme_summary_and_progress_line_have_the_cli_s_shape(tmp_path, capsys):
    from episodepipes.sharding import cli
    from episodepipes.sharding.write.meter import Meter

    src = tmp_path / "src"
    for i in range(4):  # the README's run: 4 raw episodes of 5 frames, one with "split" in meta.json
        d = src / f"ep{i}" / "front"
        d.mkdir(parents=True)
        for k in range(5):
            cv2.imwrite(str(d / f"{k:06d}.png"), np.full((32, 48, 3), 40 * k, np.uint8))
        np.savez(d.parent / "arrays.npz", state=np.zeros((5, 3), np.float32))
        (d.parent / "meta.json").write_text(json.dumps({"fps": 10, **({"split": "val"} if i == 0 else {})}))
    assert cli.main(["write", str(src), str(tmp_path / "out"), "--val-fraction", "0.5", "--workers", "1"]) == 0
    out = capsys.readouterr().out.replace(str(tmp_path / "out"), "out").splitlines()
    section = README.split("## CLI\n", 1)[1].split("\n## ", 1)[0]
    (summary,) = re.findall(r"  ```\n(  wrote .*?)  ```", section, flags=re.S)
    assert [_digits_as_n(x.strip()) for x in summary.splitlines()] == [_digits_as_n(x) for x in out]
    assert out[1] == summary.splitlines()[1].strip()  # the split origins, exactly: metadata wins over the option
    line = re.search(r"such as `(episodes .*?)`", section).group(1)
    meter = Meter(16, 0, enabled=False)
    for _ in range(5):
        meter.update(24)
    assert _digits_as_n(line) == _digits_as_n(meter.line())


def test_format_module_factory_runs_the_readme_reader_from_the_command_line(tmp_path, monkeypatch):
    from episodepipes.sharding import cli

    monkeypatch.setattr(readers, "FORMATS", dict(readers.FORMATS))
    code = _block("register_format(").split("\n\nregister_format(", 1)[0]  # imports and the NpyReader class
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "reader.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "src").mkdir()
    np.save(tmp_path / "src" / "a.npy", np.zeros((3, 16, 16, 3), np.uint8))
    assert "--format mypkg.reader:NpyReader" in README
    assert cli.main(["write", str(tmp_path / "src"), str(tmp_path / "out"), "--format", "mypkg.reader:NpyReader",
                     "--workers", "1"]) == 0
    assert [(e.id, e.length) for e in EpisodeIndex.open(tmp_path / "out").episodes] == [("a", 3)]
    assert f'[project.entry-points."{readers.ENTRY_POINTS}"]' in README
