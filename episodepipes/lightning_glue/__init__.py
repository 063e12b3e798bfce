"""Lightning adapter: gated val loaders with known lengths, the render gate, the rank-0 overlay video writer.

Typical use: ``val_dataloader()`` returns ``ValLoaders(metrics={...}, videos={...})`` and the Trainer
gets ``OverlayVideoWriter(dirpath, every_n_passes=N)`` (N is set there, and only there).
``episodepipes.lightning_glue.launch.run_ranks`` starts a script's DDP ranks itself and checks every rank's exit.
"""

from episodepipes.lightning_glue.gating import RenderGate, is_render_pass
from episodepipes.lightning_glue.loaders import ValLoaders
from episodepipes.lightning_glue.mp4 import AtomicMp4
from episodepipes.lightning_glue.overlay import draw_overlay
from episodepipes.lightning_glue.video_writer import OverlayVideoWriter

__all__ = ["AtomicMp4", "OverlayVideoWriter", "RenderGate", "ValLoaders", "draw_overlay", "is_render_pass"]
