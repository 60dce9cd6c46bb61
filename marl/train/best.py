"""The best checkpoint of a run by exact evaluation: in self-play the last iterate need not be
the best, so the step with the lowest exploitability so far is checkpointed too and
``RUN/best`` names it."""

from __future__ import annotations

import math
import shutil
from dataclasses import dataclass
from pathlib import Path

from marl.infra.layout import BEST, checkpoint_dir, point


@dataclass
class BestCheckpoint:
    run_dir: Path
    checkpoint_every: int
    record: dict | None = None  # {"step", "exploitability"} of the best checkpoint

    def improved(self, metrics: dict, step: int) -> dict | None:
        """If this step's exact evaluation is the best so far, the previous best (or an empty
        dict), and this step becomes the best; else None."""
        value = metrics.get("eval", {}).get("exploitability")
        if (
            value is None
            or not math.isfinite(value)
            or (self.record is not None and value >= self.record["exploitability"])
        ):
            return None
        previous, self.record = self.record or {}, {"step": step, "exploitability": value}
        return previous

    def keep(self, path: Path, previous: dict) -> None:
        """Point ``RUN/best`` at ``path``; drop the superseded best checkpoint if it was
        written only for being the best (off the ``checkpoint_every`` schedule)."""
        point(self.run_dir, BEST, path)
        step = previous.get("step")
        if step is not None and step % self.checkpoint_every != 0:
            shutil.rmtree(checkpoint_dir(self.run_dir, step), ignore_errors=True)
