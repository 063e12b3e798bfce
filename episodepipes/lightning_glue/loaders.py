"""`ValLoaders`: what ``LightningDataModule.val_dataloader()`` returns: named metric and video pipes.

Lightning flattens what ``val_dataloader()`` returns with torch's pytree registry. A ``list`` or
``dict`` *subclass* is not in that registry, so Lightning would take the whole container for one
loader and yield the pipes themselves as batches. ``ValLoaders`` is therefore a dataclass registered
with the public ``torch.export.register_dataclass``: Lightning sees its metric pipes, then its video
pipes, as separate loaders in that order, and ``trainer.val_dataloaders`` gives the ``ValLoaders`` back.

That flattening is how Lightning 2.5/2.6 behaves (``CombinedLoader`` over torch's pytree), not a documented
promise; ``tests/lightning_glue/test_lightning_loaders.py::test_lightning_takes_each_pipe_as_one_loader`` checks it
and names it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch.export

from episodepipes.lightning_glue.names import check_folder_clash, check_video_loader_name

if TYPE_CHECKING:
    from episodepipes.pipes import Pipe


@dataclass(frozen=True, eq=False)
class ValLoaders:
    """Metric pipes, then video pipes, as Lightning val dataloaders with known, rank-independent lengths.

    Example:
        ``return ValLoaders(metrics={"val": metric_pipe(...)}, videos={"pinned": video_pipe(...)})``

    In ``validation_step(batch, batch_idx, dataloader_idx=0)`` use ``loaders.is_video(dataloader_idx)``
    to skip the metric code (and every ``self.log``) on video batches. An empty group is stored as None:
    Lightning would take an empty mapping for a loader of its own.

    Args:
        metrics: name -> metric pipe (`metric_pipe`), iterated on every rank every pass.
        videos: name -> gated video pipe (`video_pipe`). A video loader's name is the folder its videos go to,
            so it must be 1-64 characters of ``A-Z a-z 0-9 _ - .`` not starting with ``.`` (refused otherwise).
    """

    metrics: Mapping[str, Pipe] | None = None
    videos: Mapping[str, Pipe] | None = None

    def __post_init__(self) -> None:
        groups = {}
        for kind in ("metrics", "videos"):
            pipes = getattr(self, kind)
            if pipes is not None and not isinstance(pipes, Mapping):
                raise TypeError(f"{kind}={pipes!r} should be a mapping of name -> Pipe, e.g. {{'val': pipe}}")
            groups[kind] = dict(pipes) if pipes else None
            object.__setattr__(self, kind, groups[kind])
        if not groups["metrics"] and not groups["videos"]:
            raise ValueError("ValLoaders needs at least one pipe: pass metrics={...} and/or videos={...}")
        clash = set(groups["metrics"] or ()) & set(groups["videos"] or ())
        if clash:
            raise ValueError(f"names {sorted(clash)} are used for both a metric and a video pipe; rename one")
        for name, pipe in (groups["metrics"] or {}).items():
            _check_sized(name, pipe)
        for name, pipe in (groups["videos"] or {}).items():
            check_video_loader_name(name)  # it becomes OverlayVideoWriter's folder
            _check_sized(name, pipe)
            if getattr(pipe, "gate", None) is None:
                raise ValueError(f"videos[{name!r}]={pipe!r} has no gate; build it with episodepipes.pipes.video_pipe")
        check_folder_clash(list(groups["videos"] or ()))

    @property
    def names(self) -> list[str]:
        """Loader names in dataloader order (``dataloader_idx`` is the position here)."""
        return [*(self.metrics or {}), *(self.videos or {})]

    @property
    def pipes(self) -> list[Pipe]:
        """The pipes in dataloader order."""
        return [*(self.metrics or {}).values(), *(self.videos or {}).values()]

    def name(self, dataloader_idx: int) -> str:
        """The name of loader ``dataloader_idx``.

        Args:
            dataloader_idx: the index Lightning passes to ``validation_step``.
        """
        names = self.names
        if not 0 <= dataloader_idx < len(names):
            raise IndexError(f"dataloader_idx={dataloader_idx} is outside the {len(names)} loaders {names}")
        return names[dataloader_idx]

    def is_video(self, dataloader_idx: int) -> bool:
        """True when loader ``dataloader_idx`` is a (gated, rank-0-only) video pipe: log nothing from it.

        Args:
            dataloader_idx: the index Lightning passes to ``validation_step``.
        """
        return self.name(dataloader_idx) in (self.videos or {})

    def pipe(self, dataloader_idx: int) -> Pipe:
        """The pipe behind loader ``dataloader_idx``.

        Args:
            dataloader_idx: the index Lightning passes to ``validation_step``.
        """
        return self.pipes[self.names.index(self.name(dataloader_idx))]

    def index_of(self, name: str) -> int:
        """The ``dataloader_idx`` of the loader called ``name``.

        Args:
            name: a key of ``metrics`` or ``videos``.
        """
        if name not in self.names:
            raise KeyError(f"no loader named {name!r}; loaders: {self.names}")
        return self.names.index(name)

    def lengths(self) -> list[int]:
        """Batches per loader on this rank, from the pipes' plans: no iterator, no I/O."""
        return [len(p) for p in self.pipes]


def _check_sized(name: str, pipe: Any) -> None:
    if not (hasattr(pipe, "__len__") and hasattr(pipe, "__iter__")):
        raise TypeError(f"loader {name!r}={pipe!r} should be a sized iterable such as an episodepipes Pipe")


try:
    torch.export.register_dataclass(ValLoaders, serialized_type_name="episodepipes.lightning_glue.ValLoaders")
except ValueError:  # already registered: this module was imported again (importlib.reload)
    pass
