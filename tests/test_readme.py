"""The README's code runs: the custom graph executes on real shards; the Lightning snippet is the checked file."""

import re
from pathlib import Path

import torch
from helpers import make_shards

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README, flags=re.S)


def test_custom_graph_example_runs_and_transforms_before_batching(tmp_path, monkeypatch):
    make_shards(tmp_path / "shards", num_episodes=4, length=20)
    monkeypatch.chdir(tmp_path)
    code = next(b for b in _blocks() if "Gate(build" in b)
    code = code.replace("    ...", "    batches.append(batch)")
    scope: dict = {"batches": []}
    exec(compile(code, "README.md:custom-graph", "exec"), scope)
    batches = scope["batches"]
    assert [len(b["episode"]) for b in batches] == [8, 8, 4]  # ep0002's 20 frames, in order
    assert torch.cat([b["frame"] for b in batches]).tolist() == list(range(20))
    assert batches[0]["front"].shape[-2:] == (48, 64) and batches[0]["wrist"].shape[-2:] == (96, 128)


def test_lightning_snippet_is_the_private_api_checked_example_file():
    example = (ROOT / "docs" / "lightning_example.py").read_text()
    body = example.split("\n", 1)[1].strip()  # the file's first line is a comment heading
    assert any(b.strip() == body for b in _blocks()), "README snippet != docs/lightning_example.py"
