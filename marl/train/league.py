"""Opponent pools for self-play: past snapshots, fixed anchors and the latest policy.

Pure self-play policy gradient tends to cycle; playing against a pool of past snapshots and
fixed anchors (RLlib's league examples, fictitious self-play) keeps old weaknesses punished.
An opponent is a :class:`~marl.infra.seats.ParticipantId` (``bot:<name>``,
``ckpt:<folder>``, ``snap:<step>``), or None for the latest policy (self-play).
With ``sampling: winrate`` an opponent is drawn with weight ``(trainee losses + 1) /
(games + 2)`` against it, so opponents that still win are met more often.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Mapping

import torch

from marl.config.train import LeagueConfig
from marl.infra.seats import UNTRAINED, ParticipantId

Weights = dict[str, dict[str, torch.Tensor]]  # adapter -> tensor name -> tensor


def anchor_id(anchor: str, bot_names: list[str]) -> ParticipantId:
    """Who a ``league.anchors`` entry seats: a bot, the untrained self, or a checkpoint."""
    if anchor in bot_names:
        return ParticipantId("bot", anchor)
    if anchor == UNTRAINED:
        return ParticipantId("base", UNTRAINED)
    return ParticipantId("ckpt", anchor)


class League:
    def __init__(self, cfg: LeagueConfig, bot_names: list[str]) -> None:
        self.cfg = cfg
        self.anchors = [anchor_id(a, bot_names) for a in cfg.anchors]
        self.snapshots: OrderedDict[ParticipantId, Weights] = OrderedDict()
        self.results: dict[ParticipantId, list[int]] = {}  # opponent -> [games, trainee losses]

    def pool(self) -> list[ParticipantId]:
        """The opponents besides the latest policy."""
        return [*self.anchors, *self.snapshots]

    def sample(self, rng: random.Random) -> ParticipantId | None:
        if self.cfg.opponents == "self":
            return None
        pool = self.pool()
        if not pool or rng.random() < self.cfg.latest_prob:
            return None
        if self.cfg.sampling == "uniform":
            return rng.choice(pool)
        weights = [
            (self.results.get(o, [0, 0])[1] + 1) / (self.results.get(o, [0, 0])[0] + 2)
            for o in pool
        ]
        return rng.choices(pool, weights=weights)[0]

    def record(self, opponent: ParticipantId, trainee_lost: bool) -> None:
        games_losses = self.results.setdefault(opponent, [0, 0])
        games_losses[0] += 1
        games_losses[1] += int(trainee_lost)

    def maybe_snapshot(self, step: int, weights: Weights) -> bool:
        """Add the current policy every ``snapshot_every`` steps; evict the oldest."""
        if self.cfg.opponents != "league" or step % self.cfg.snapshot_every:
            return False
        self.snapshots[ParticipantId("snap", str(step))] = weights
        while len(self.snapshots) > self.cfg.pool_size:
            old, _ = self.snapshots.popitem(last=False)
            self.results.pop(old, None)
        return True

    def state(self) -> dict:
        """JSON-able state, ids written out (snapshot weights are saved separately)."""
        return {
            "snapshots": [str(k) for k in self.snapshots],
            "results": {str(k): v for k, v in self.results.items()},
        }

    def load_state(self, state: dict, snapshots: Mapping[ParticipantId, Weights]) -> None:
        ids = [ParticipantId.parse(k) for k in state["snapshots"]]
        self.snapshots = OrderedDict((k, snapshots[k]) for k in ids)
        self.results = {ParticipantId.parse(k): list(v) for k, v in state["results"].items()}
