"""The trainer's side of a team's communication graph: fixed, or learned jointly.

A team-task run (``train.rollout: team``) asks one of two strategies, once per step:

- :class:`FixedGraph`: every episode runs the configured topology (game runs use it too,
  with nothing to report);
- :class:`LearnedGraph`: ``assign`` samples one graph per episode from the
  :class:`~marl.topologies.LearnableTopology` (an edge mask carried by the episode spec, seeded
  from (run seed, step) so a resumed run samples the same graphs); after the rollouts,
  ``update`` takes one REINFORCE step on utility = score - lambda x cost, the baseline taken
  within each GRPO group (the episodes of one task), in the same step as the GRPO update of
  the role policies (or alone, with ``train.policies: frozen``).

Both write into a checkpoint folder and read it back, so ``--resume`` restores the logits and
their optimizer; ``marl export`` deploys ``topology.safetensors`` as explicit YAML edges.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from marl.agents.rollout import Episode
from marl.config import TeamConfig
from marl.infra.layout import TOPOLOGY_FILE
from marl.infra.seeds import derive_seed
from marl.topologies import TEMPORAL, Edge, LearnableTopology
from marl.train.checkpoint import load_optimizer_state, save_optimizer_state
from marl.train.workers import EpisodeSpec, TeamEpisode

OPTIMIZER_STEM = "topology_optimizer"


class GraphStrategy(Protocol):
    """What the trainer asks of a team's graph at every step and checkpoint."""

    def assign(self, specs: list[EpisodeSpec], step: int) -> list[EpisodeSpec]: ...

    def update(self, episodes: list[Episode], specs: list[EpisodeSpec]) -> dict[str, Any]: ...

    def save(self, folder: Path) -> None: ...

    def load(self, folder: Path) -> None: ...


def team_metrics(episodes: list[Episode]) -> dict[str, Any]:
    """Score, reward (the score less deferral costs), messages and tokens per task of team
    episodes ({} for game episodes)."""
    team = [ep for ep in episodes if isinstance(ep, TeamEpisode)]
    if not team:
        return {}
    return {
        "score": float(np.mean([ep.score for ep in team])),
        "reward": float(np.mean([ep.reward for ep in team])),
        "messages_per_task": float(np.mean([ep.messages for ep in team])),
        "tokens_per_task": float(np.mean([ep.tokens for ep in team])),
    }


def deferral_rate(episodes: list[Episode]) -> float:
    """The share of team tasks a role deferred to an expert."""
    team = [ep for ep in episodes if isinstance(ep, TeamEpisode)]
    return float(np.mean([ep.deferrals > 0 for ep in team])) if team else 0.0


def edge_label(edge: Edge) -> str:
    """``solver_0->judge``; temporal (round t-1 to t) edges end in ``@t``."""
    src, dst, kind = edge
    return f"{src}->{dst}" + ("@t" if kind == TEMPORAL else "")


class FixedGraph:
    """The configured topology for every episode: nothing to sample, learn or save."""

    def assign(self, specs: list[EpisodeSpec], step: int) -> list[EpisodeSpec]:
        return specs

    def update(self, episodes: list[Episode], specs: list[EpisodeSpec]) -> dict[str, Any]:
        return team_metrics(episodes)

    def save(self, folder: Path) -> None:
        pass

    def load(self, folder: Path) -> None:
        pass


class LearnedGraph:
    """Edge logits trained by REINFORCE next to the policies' GRPO."""

    def __init__(self, cfg: TeamConfig, seed: int) -> None:
        # the same candidates, in the same order, as the workers' Team.learnable
        self.lt = LearnableTopology.from_team(cfg, final=cfg.topology.final)
        self.seed = seed

    def assign(self, specs: list[EpisodeSpec], step: int) -> list[EpisodeSpec]:
        """One sampled edge mask per episode spec."""
        gen = torch.Generator().manual_seed(derive_seed(self.seed, step, "topology"))
        masks = self.lt.sample_masks(len(specs), gen).tolist()
        return [replace(s, edge_mask=tuple(m)) for s, m in zip(specs, masks, strict=True)]

    def update(self, episodes: list[Episode], specs: list[EpisodeSpec]) -> dict[str, Any]:
        """One REINFORCE step from the step's episodes; returns the topology metrics."""
        group_of = {s.index: s.group for s in specs}
        team = [ep for ep in episodes if isinstance(ep, TeamEpisode)]
        masks = torch.tensor([ep.edge_mask for ep in team], dtype=torch.bool)
        cost = torch.tensor([float(getattr(ep, self.lt.config.cost)) for ep in team])
        reward = torch.tensor([ep.reward for ep in team])  # the score less deferral costs
        utility = self.lt.utility(reward, cost)
        groups = torch.tensor([group_of[ep.index] for ep in team])
        stats = self.lt.update_batch(masks, utility, groups)
        return {
            **team_metrics(team),
            "utility": stats["utility"],
            "loss": stats["loss"],
            "expected_edges": stats["expected_edges"],
            "entropy": stats["entropy"],
            "active": stats["active"],
            "pruned": [edge_label(e) for e in stats["pruned"]],
            "edge_probs": {
                edge_label(e): round(p, 4) for e, p in self.lt.edge_probabilities().items()
            },
        }

    def save(self, folder: Path) -> None:
        """Logits and pruning mask (``topology.safetensors``, what export deploys) and the
        Adam state of the logits."""
        self.lt.save(folder / TOPOLOGY_FILE)
        save_optimizer_state(self.lt.optimizer.state_dict(), folder / OPTIMIZER_STEM)

    def load(self, folder: Path) -> None:
        saved = LearnableTopology.load(folder / TOPOLOGY_FILE)
        if saved.candidates != self.lt.candidates:
            raise ValueError(
                f"{folder / TOPOLOGY_FILE}: its candidate edges are not this "
                "team's (was the team file changed?)"
            )
        optimizer, _meta = load_optimizer_state(folder / OPTIMIZER_STEM)
        self.lt.load_state_dict(
            {
                "theta": saved.theta.detach(),
                "active": saved.active,
                "steps": saved.steps,
                "optimizer": optimizer,
            }
        )


def graph_strategy(cfg: TeamConfig, team_rollout: bool, seed: int) -> GraphStrategy:
    """LearnedGraph for team runs whose topology is learnable, else FixedGraph."""
    return LearnedGraph(cfg, seed) if team_rollout and cfg.topology.learnable else FixedGraph()
