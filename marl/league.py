"""Opponent pools for self-play: past snapshots, fixed anchors and the latest policy.

Pure self-play policy gradient tends to cycle; playing against a pool of past snapshots and
fixed anchors (RLlib's league examples, fictitious self-play) keeps old weaknesses punished.
Opponent ids are strings: ``latest``, ``bot:<name>``, ``ckpt:<folder>``, ``snap:<step>``.
With ``sampling: winrate`` an opponent is drawn with weight ``(trainee losses + 1) /
(games + 2)`` against it, so opponents that still win are met more often.
"""

from __future__ import annotations

import random
from collections import OrderedDict

import torch

from configs.train import LeagueConfig

Weights = dict[str, dict[str, torch.Tensor]]  # adapter -> tensor name -> tensor


class League:
    def __init__(self, cfg: LeagueConfig, bot_names: list[str]) -> None:
        self.cfg = cfg
        self.anchors = [f"bot:{a}" if a in bot_names else f"ckpt:{a}" for a in cfg.anchors]
        self.snapshots: OrderedDict[str, Weights] = OrderedDict()
        self.results: dict[str, list[int]] = {}  # opponent -> [games, trainee losses]

    def opponents(self) -> list[str]:
        return ["latest", *self.anchors, *self.snapshots]

    def sample(self, rng: random.Random) -> str:
        if self.cfg.opponents == "self":
            return "latest"
        pool = [o for o in self.opponents() if o != "latest"]
        if not pool or rng.random() < self.cfg.latest_prob:
            return "latest"
        if self.cfg.sampling == "uniform":
            return rng.choice(pool)
        weights = [(self.results.get(o, [0, 0])[1] + 1) / (self.results.get(o, [0, 0])[0] + 2)
                   for o in pool]
        return rng.choices(pool, weights=weights)[0]

    def record(self, opponent: str, trainee_lost: bool) -> None:
        games_losses = self.results.setdefault(opponent, [0, 0])
        games_losses[0] += 1
        games_losses[1] += int(trainee_lost)

    def maybe_snapshot(self, step: int, weights: Weights) -> bool:
        """Add the current policy every ``snapshot_every`` steps; evict the oldest."""
        if self.cfg.opponents != "league" or step % self.cfg.snapshot_every:
            return False
        self.snapshots[f"snap:{step}"] = weights
        while len(self.snapshots) > self.cfg.pool_size:
            old, _ = self.snapshots.popitem(last=False)
            self.results.pop(old, None)
        return True

    def state(self) -> dict:
        """JSON-able state (snapshot weights are saved separately as safetensors)."""
        return {"snapshots": list(self.snapshots), "results": self.results}

    def load_state(self, state: dict, snapshots: dict[str, Weights]) -> None:
        self.snapshots = OrderedDict((k, snapshots[k]) for k in state["snapshots"])
        self.results = {k: list(v) for k, v in state["results"].items()}
