"""The magnet schedule of magnetic mirror descent (docs/algorithms.md#magnet-schedule).

The learners add ``alpha * KL(pi || magnet)`` to the loss; this object decides what the magnet
is: the initial policy, then every ``every`` steps ``(1 - g) magnet + g policy`` in adapter
weights (``g = 1``: a copy of the policy).  The trainer owns it, so it is checkpointed with the
run (``magnet/<role>.safetensors``, the share in their metadata) and a resumed run moves it on
the same steps.

``start: uniform`` (policy targets) begins from the uniform distribution over the legal moves
instead.  The magnet is then ``log rho = s log p_M + const``: a share ``s`` (0 at the start) of
the adapter ``M`` and the rest uniform.  A move towards the policy in log space,
``(1 - g) log rho + g log pi``, gives ``s' = (1 - g) s + g`` and mixes ``M`` towards the policy
by ``g / s'`` of the way (the whole way at the first move), as the weights mix for
``start: policy`` (``s = 1`` throughout).
"""

from __future__ import annotations

from pathlib import Path

from safetensors import safe_open
from safetensors.torch import load_file, save_file

from marl.config.train import MagnetConfig
from marl.train.league import Weights

FOLDER = "magnet"


def start_share(cfg: MagnetConfig) -> float:
    """The adapter's share of the magnet before its first move."""
    return 0.0 if cfg.start == "uniform" else 1.0


class Magnet:
    def __init__(self, cfg: MagnetConfig, start: Weights) -> None:
        self.cfg = cfg
        self.weights: Weights = start
        self.share = start_share(cfg)

    def due(self, step: int) -> bool:
        return step % self.cfg.every == 0

    def move(self, policy: Weights) -> tuple[Weights, float]:
        """The magnet after a move towards ``policy``: its weights and share."""
        g = self.cfg.mix
        self.share = (1 - g) * self.share + g
        h = g / self.share  # = g from a policy start
        self.weights = {
            a: {k: v if h == 1 else (1 - h) * self.weights[a][k] + h * v for k, v in sd.items()}
            for a, sd in policy.items()
        }
        return self.weights, self.share

    def save(self, folder: Path) -> None:
        (folder / FOLDER).mkdir()
        for role, sd in self.weights.items():
            save_file(
                {k: v.detach().cpu().contiguous() for k, v in sd.items()},
                str(folder / FOLDER / f"{role}.safetensors"),
                metadata={"share": repr(self.share)},
            )

    def load(self, folder: Path) -> tuple[Weights, float]:
        files = sorted((folder / FOLDER).glob("*.safetensors"))
        self.weights = {f.stem: load_file(str(f)) for f in files}
        with safe_open(str(files[0]), "pt") as f:
            self.share = float((f.metadata() or {}).get("share", 1.0))
        return self.weights, self.share
