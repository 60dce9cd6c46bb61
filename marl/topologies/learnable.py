"""Learnable communication topology: one Bernoulli edge per candidate, trained by REINFORCE.

GPTSwarm / AgentPrune style.  Candidates are the spatial edges of the complete graph under a
fixed agent order (``agents[i] -> agents[j]`` for ``i < j``, so every sample is a DAG), plus,
optionally, every temporal edge.  Each candidate ``e`` has a logit ``theta_e``::

    p_e = sigmoid(theta_e / tau)                      a_e ~ Bernoulli(p_e)   (one graph per episode)
    log P(a) = sum_e  a_e log p_e + (1 - a_e) log(1 - p_e)          (pruned edges: a_e = 0, no term)
    R_b = score_b - lambda * cost_b                    (cost: messages or tokens of episode b)
    loss = -(1/B) sum_b (R_b - baseline_b) * log P(a_b)              (one Adam step per update)

A trainer draws one edge mask per episode with :meth:`LearnableTopology.sample_masks`, plays
the graph :meth:`~LearnableTopology.topology_of` gives, and passes the masks and utilities to
:meth:`LearnableTopology.update_batch`, in the same step as its GRPO update (joint training) or
alone with frozen policies.  Every ``prune_every`` updates the least likely candidates are
dropped for good; :meth:`deploy` keeps the edges with ``p > threshold`` (or the top k) as a
plain :class:`Topology`.  The settings are the team file's ``topology.learning`` section
(:class:`~marl.config.schema.TopologyLearningConfig`), saved with the logits.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from marl.config.schema import TeamConfig, TopologyLearningConfig
from marl.topologies.builders import TeamLayout, resolve_agent
from marl.topologies.graph import SPATIAL, TEMPORAL, Edge, Topology, TopologyError

FORMAT = "marl-teams/learnable-topology/v1"

Baseline = Callable[[torch.Tensor], torch.Tensor]
_BASELINES: dict[str, Baseline] = {}


def register_baseline(name: str) -> Callable[[Baseline], Baseline]:
    """``@register_baseline("loo")`` on ``baseline(utilities[B]) -> baselines[B]``."""

    def deco(fn: Baseline) -> Baseline:
        _BASELINES[name] = fn
        return fn

    return deco


@register_baseline("none")
def no_baseline(r: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(r)


@register_baseline("mean")
def batch_mean(r: torch.Tensor) -> torch.Tensor:
    return r.mean().expand_as(r)


@register_baseline("loo")
def leave_one_out(r: torch.Tensor) -> torch.Tensor:
    """Mean of the other samples: unbiased, unlike the batch mean that includes R_b itself."""
    return (r.sum() - r) / max(r.numel() - 1, 1)


def candidate_edges(agents: Sequence[str], temporal: bool = False) -> list[Edge]:
    """Spatial ``agents[i] -> agents[j]`` for i < j, then (``temporal``) all pairs incl. self."""
    n = len(agents)
    edges = [(agents[i], agents[j], SPATIAL) for i in range(n) for j in range(i + 1, n)]
    if temporal:
        edges += [(u, v, TEMPORAL) for u in agents for v in agents]
    return edges


class LearnableTopology:
    """Edge logits over a fixed candidate set, with sampling, REINFORCE updates and pruning."""

    def __init__(
        self,
        agents: Sequence[str],
        *,
        rounds: int = 1,
        final: str | None = None,
        config: TopologyLearningConfig | None = None,
    ) -> None:
        config = config or TopologyLearningConfig()
        if config.temporal is None:  # the schema's default: learn them when there are rounds
            config = config.replace(temporal=rounds > 1)
        self.config = config
        if self.config.temporal and rounds < 2:
            raise TopologyError(
                "temporal candidates need rounds >= 2 (a single round has no "
                "previous round to read)"
            )
        self.agents = list(agents)
        self.rounds = rounds
        self.final = final if final is not None else self.agents[-1]
        Topology(self.agents, rounds=rounds, final=self.final, strict=False)  # validate names
        self.candidates = candidate_edges(self.agents, self.config.temporal)
        self.theta = torch.nn.Parameter(
            torch.full((len(self.candidates),), float(self.config.init_logit))
        )
        self.active = torch.ones(len(self.candidates), dtype=torch.bool)
        self.optimizer = torch.optim.Adam([self.theta], lr=self.config.lr)
        self.steps = 0

    @classmethod
    def from_team(
        cls,
        cfg: TeamConfig,
        *,
        final: str | None = None,
        config: TopologyLearningConfig | None = None,
    ) -> LearnableTopology:
        """Candidates over the team's instances in role order, the decision agent (``final``,
        default the last one) moved to the end; settings from ``topology.learning``."""
        team = TeamLayout.from_roles(cfg.roles)
        final = team.agents[-1] if final is None else resolve_agent(final, team, "final")
        agents = [a for a in team.agents if a != final] + [final]
        return cls(
            agents, rounds=cfg.topology.rounds, final=final, config=config or cfg.topology.learning
        )

    # ----- probabilities
    def _logp(self) -> tuple[torch.Tensor, torch.Tensor]:
        z = self.theta / self.config.tau
        return torch.nn.functional.logsigmoid(z), torch.nn.functional.logsigmoid(-z)

    def probs(self) -> torch.Tensor:
        """p_e per candidate (0 for pruned ones), detached."""
        with torch.no_grad():
            return torch.sigmoid(self.theta / self.config.tau) * self.active

    def edge_probabilities(self) -> dict[Edge, float]:
        """p_e of every remaining candidate."""
        p = self.probs().tolist()
        return {e: p[i] for i, e in enumerate(self.candidates) if self.active[i]}

    def log_prob(self, mask: torch.Tensor) -> torch.Tensor:
        """log P(a) of masks ``[..., E]`` under the current logits (differentiable)."""
        log_on, log_off = self._logp()
        a = mask.to(log_on.dtype)
        return ((a * log_on + (1 - a) * log_off) * self.active).sum(-1)

    # ----- sampling
    def sample_masks(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """``n`` independent edge masks ``[n, E]`` (bool); pruned candidates are never on."""
        u = torch.rand(n, len(self.candidates), generator=generator)
        return (u < self.probs()) & self.active

    def topology_of(self, mask: torch.Tensor) -> Topology:
        """The graph of one mask; agents it cuts off from the decision node are pruned."""
        edges = [e for e, on in zip(self.candidates, mask.tolist(), strict=True) if on]
        return Topology(self.agents, edges, rounds=self.rounds, final=self.final, strict=False)

    def utility(
        self, score: float | torch.Tensor, cost: float | torch.Tensor
    ) -> float | torch.Tensor:
        """R = score - lambda * cost, with lambda = ``config.cost_weight``; cost is e.g. the
        episode's ``topology.num_messages()`` or its message tokens."""
        return score - self.config.cost_weight * cost

    # ----- learning
    def update_batch(
        self, masks: torch.Tensor, utilities: torch.Tensor, groups: torch.Tensor | None = None
    ) -> dict[str, Any]:
        """One REINFORCE step from the episodes' masks ``[B, E]`` and utilities ``[B]``:
        loss = -(1/B) sum_b (R_b - baseline_b) * log P(a_b), then scheduled pruning.  With
        ``groups`` ``[B]`` the baseline is taken within each group (episodes of the same
        task), so task difficulty cancels out and only the graph's effect remains."""
        logp, utilities = self.log_prob(masks), utilities.to(torch.float32)
        baseline = _BASELINES[self.config.baseline]
        if groups is None:
            advantage = utilities - baseline(utilities)
        else:
            advantage = torch.empty_like(utilities)
            for g in groups.unique():
                cell = groups == g
                advantage[cell] = utilities[cell] - baseline(utilities[cell])
        loss = -(advantage.detach() * logp).mean()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.steps += 1
        c = self.config
        pruned = (
            self.prune(c.prune_fraction, c.prune_threshold)
            if c.prune_every and self.steps % c.prune_every == 0
            else []
        )
        p = self.probs()[self.active]
        entropy = -(p * p.clamp_min(1e-12).log() + (1 - p) * (1 - p).clamp_min(1e-12).log())
        return {
            "step": self.steps,
            "loss": loss.item(),
            "utility": utilities.mean().item(),
            "advantage_std": advantage.std().item() if advantage.numel() > 1 else 0.0,
            "expected_edges": p.sum().item(),
            "entropy": entropy.sum().item(),
            "active": int(self.active.sum()),
            "pruned": pruned,
        }

    def prune(self, fraction: float = 0.0, threshold: float = 0.0) -> list[Edge]:
        """Drop for good the candidates with p_e < threshold, then the lowest-p ``fraction``
        of those remaining (rounded down); returns the dropped edges."""
        p = self.probs()
        drop = self.active & (p < threshold)
        remaining = (self.active & ~drop).nonzero().flatten()
        k = math.floor(fraction * remaining.numel())
        if k:
            drop[remaining[p[remaining].argsort(stable=True)[:k]]] = True
        self.active &= ~drop
        return [self.candidates[i] for i in drop.nonzero().flatten().tolist()]

    def deploy(
        self, threshold: float = 0.5, top_k: int | None = None, strict: bool = False
    ) -> Topology:
        """The edges with p_e > threshold, or (``top_k``) the k most likely remaining ones."""
        p = self.probs()
        if top_k is None:
            mask = self.active & (p > threshold)
        else:
            ranked = [i for i in p.argsort(descending=True, stable=True).tolist() if self.active[i]]
            mask = torch.zeros_like(self.active)
            mask[ranked[:top_k]] = True
        topo = self.topology_of(mask)
        return (
            topo
            if not strict
            else Topology(
                topo.agents, topo.edges, rounds=self.rounds, final=self.final, strict=True
            )
        )

    # ----- persistence
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``theta``, ``active``, ``optimizer`` (Adam's state) and ``steps``,
        as a trainer's checkpoint holds them."""
        with torch.no_grad():
            self.theta.copy_(state["theta"])
        self.active = state["active"].clone()
        self.optimizer.load_state_dict(state["optimizer"])
        self.steps = int(state["steps"])

    def save(self, path: str | Path) -> None:
        """Logits and the pruning mask as safetensors; candidates and config in the metadata."""
        meta = {
            "format": FORMAT,
            "agents": json.dumps(self.agents),
            "rounds": str(self.rounds),
            "final": self.final,
            "candidates": json.dumps(self.candidates),
            "config": json.dumps(self.config.model_dump()),
            "steps": str(self.steps),
        }
        save_file(
            {"logits": self.theta.detach().contiguous(), "active": self.active},
            str(path),
            metadata=meta,
        )

    @classmethod
    def load(cls, path: str | Path) -> LearnableTopology:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            if meta.get("format") != FORMAT:
                raise ValueError(
                    f"{path}: not a learnable topology file (format "
                    f"{meta.get('format')!r}, expected {FORMAT!r})"
                )
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (not a dict)
        topo = cls(
            json.loads(meta["agents"]),
            rounds=int(meta["rounds"]),
            final=meta["final"],
            config=TopologyLearningConfig.model_validate(json.loads(meta["config"])),
        )
        stored = [tuple(e) for e in json.loads(meta["candidates"])]
        if stored != topo.candidates:
            raise ValueError(f"{path}: candidate edges differ from those of its agents/config")
        with torch.no_grad():
            topo.theta.copy_(tensors["logits"])
        topo.active = tensors["active"].clone()
        topo.steps = int(meta["steps"])
        return topo
