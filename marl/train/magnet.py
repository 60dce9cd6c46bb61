"""The magnet schedule of magnetic mirror descent (docs/algorithms.md#magnet-schedule).

The learners add ``alpha * KL(pi || magnet)`` to the loss; this object decides what the magnet
is: the initial policy, then every ``every`` steps ``(1 - g) magnet + g policy`` in adapter
weights (``g = 1``: a copy of the policy).  The trainer owns it, so it is checkpointed with the
run (``magnet/<role>.safetensors``) and a resumed run moves it on the same steps.
"""

from __future__ import annotations

from pathlib import Path

from safetensors.torch import load_file, save_file

from marl.config.train import MagnetConfig
from marl.train.league import Weights

FOLDER = "magnet"


class Magnet:
    def __init__(self, cfg: MagnetConfig, start: Weights) -> None:
        self.cfg = cfg
        self.weights: Weights = start

    def due(self, step: int) -> bool:
        return step % self.cfg.every == 0

    def move(self, policy: Weights) -> Weights:
        """The magnet after a move towards ``policy``."""
        g = self.cfg.mix
        self.weights = {
            a: {k: v if g == 1 else (1 - g) * self.weights[a][k] + g * v for k, v in sd.items()}
            for a, sd in policy.items()
        }
        return self.weights

    def save(self, folder: Path) -> None:
        (folder / FOLDER).mkdir()
        for role, sd in self.weights.items():
            save_file(
                {k: v.detach().cpu().contiguous() for k, v in sd.items()},
                str(folder / FOLDER / f"{role}.safetensors"),
            )

    def load(self, folder: Path) -> Weights:
        self.weights = {
            f.stem: load_file(str(f)) for f in sorted((folder / FOLDER).glob("*.safetensors"))
        }
        return self.weights
