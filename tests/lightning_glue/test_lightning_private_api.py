"""No Lightning private API anywhere in the package: an AST scan of every source file.

Flagged: importing a ``_``-prefixed module or name from lightning (``lightning``, ``pytorch_lightning``,
``lightning_fabric``); an ``_``-prefixed attribute of a lightning module alias; an ``_``-prefixed
attribute (or ``getattr`` string) of a Lightning object by its usual name (``trainer._x``,
``pl_module._x``, ``self.strategy._x`` ...). Dunders are allowed. Our own ``self._x`` is not Lightning's.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIGHTNING = ("lightning", "pytorch_lightning", "lightning_fabric")
OBJECTS = {"trainer", "pl_module", "lightning_module", "strategy", "datamodule", "fit_loop", "validate_loop",
           "accelerator", "logger", "loggers", "callback_metrics", "logged_metrics", "val_dataloaders"}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _last(node: ast.AST) -> str | None:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None


def violations(source: str, filename: str = "<src>") -> list[str]:
    tree = ast.parse(source, filename)
    aliases: set[str] = set()
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in LIGHTNING:
                    aliases.add((a.asname or a.name).split(".")[0])
                    if any(_private(p) for p in a.name.split(".")):
                        out.append(f"{filename}:{node.lineno}: import {a.name}")
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in LIGHTNING:
            parts = node.module.split(".") + [a.name for a in node.names]
            if any(_private(p) for p in parts):
                out.append(f"{filename}:{node.lineno}: from {node.module} import {[a.name for a in node.names]}")
            aliases.update(a.asname or a.name for a in node.names)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            owner = _last(node.value)
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if owner in OBJECTS or (isinstance(root, ast.Name) and root.id in aliases):
                out.append(f"{filename}:{node.lineno}: {ast.unparse(node)}")
        elif (isinstance(node, ast.Call) and _last(node.func) in ("getattr", "setattr", "hasattr")
              and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
              and isinstance(node.args[1].value, str) and _private(node.args[1].value)
              and _last(node.args[0]) in OBJECTS):
            out.append(f"{filename}:{node.lineno}: {ast.unparse(node)}")
    return out


def _sources():
    files = sorted((ROOT / "episodepipes").rglob("*.py"))
    files += [p for p in (ROOT / "docs" / "lightning_example.py", ROOT / "tests" / "ddp" / "app.py") if p.exists()]
    return files


def test_the_package_uses_no_lightning_private_api():
    files = _sources()
    assert any(p.parent.name == "lightning_glue" for p in files)
    found = [v for p in files for v in violations(p.read_text(), str(p.relative_to(ROOT)))]
    assert found == []


@pytest.mark.parametrize("bad", [
    "from lightning.pytorch.utilities._pytree import _tree_flatten",
    "import lightning.pytorch.loops._x",
    "from lightning.pytorch.trainer.connectors import _helpers",
    "from lightning.pytorch.utilities.combined_loader import _Sequential",
    "import lightning.pytorch as pl\nx = pl.utilities._pytree",
    "def f(trainer):\n    return trainer._logger_connector",
    "def f(self):\n    return self.trainer.strategy._timeout",
    "def f(pl_module):\n    return getattr(pl_module, '_results')",
])
def test_the_scan_catches(bad):
    assert violations(bad)


@pytest.mark.parametrize("good", [
    "import lightning.pytorch as pl\nclass C(pl.Callback):\n    def f(self):\n        return self._trainer",
    "def f(trainer):\n    return trainer.global_rank, trainer.__class__",
    "from lightning.pytorch.loggers import TensorBoardLogger",
    "import torch.export\ntorch.export.register_dataclass(int)",
])
def test_the_scan_allows(good):
    assert violations(good) == []
