"""Learnable communication topology: one Bernoulli edge per candidate, trained by REINFORCE.

GPTSwarm / AgentPrune style.  Candidates are the spatial edges of the complete graph under a
fixed agent order (``agents[i] -> agents[j]`` for ``i < j``, so every sample is a DAG), plus,
optionally, every temporal edge.  Each candidate ``e`` has a logit ``theta_e``::

    p_e = sigmoid(theta_e / tau)                      a_e ~ Bernoulli(p_e)   (one graph per episode)
    log P(a) = sum_e  a_e log p_e + (1 - a_e) log(1 - p_e)          (pruned edges: a_e = 0, no term)
    R_b = score_b - lambda * cost_b                    (cost: messages or tokens of episode b)
    loss = -(1/B) sum_b (R_b - baseline_b) * log P(a_b)              (one Adam step per update)

A trainer calls :meth:`LearnableTopology.sample` per episode, plays it, and passes
``(topology or mask or log_prob, utility)`` pairs to :meth:`LearnableTopology.update`, in the
same step as its GRPO update (joint training) or alone with frozen policies.  Every
``prune_every`` updates the least likely candidates are dropped for good; :meth:`deploy` keeps
the edges with ``p > threshold`` (or the top k) as a plain :class:`Topology`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from configs.schema import TeamConfig, TopologyConfig, TopologyLearningConfig
from topologies.builders import TeamLayout, resolve_agent
from topologies.graph import SPATIAL, TEMPORAL, Edge, Topology, TopologyError

FORMAT = "marl-teams/learnable-topology/v1"
#: What an episode's cost may count: edges used (messages read), or every turn's tokens.
COSTS = ("messages", "tokens")

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


@dataclass
class LearnableConfig:
    """Hyper-parameters of a learnable topology (saved with its logits)."""

    lr: float = 0.1               # Adam step size on the logits
    tau: float = 1.0              # temperature: p_e = sigmoid(theta_e / tau)
    cost_weight: float = 0.0      # lambda in R = score - lambda * cost (see utility())
    cost: str = "messages"        # what cost counts per episode: messages | tokens
    baseline: str = "loo"         # a registered baseline: none | mean | loo
    init_logit: float = 0.0       # theta_e at start (0: p_e = 0.5)
    temporal: bool = False        # also learn temporal candidates (needs rounds > 1)
    prune_every: int = 0          # prune after every k-th update (0: never)
    prune_fraction: float = 0.0   # ... the lowest-probability fraction of remaining candidates
    prune_threshold: float = 0.0  # ... and every candidate with p_e below this

    def __post_init__(self) -> None:
        if self.baseline not in _BASELINES:
            raise ValueError(f"unknown baseline {self.baseline!r}; known: "
                             f"{', '.join(sorted(_BASELINES))}")
        if self.cost not in COSTS:
            raise ValueError(f"unknown cost {self.cost!r}; known: {', '.join(COSTS)}")
        if self.tau <= 0:
            raise ValueError(f"tau must be > 0, got {self.tau}")
        if not 0.0 <= self.prune_fraction < 1.0:
            raise ValueError(f"prune_fraction must be in [0, 1), got {self.prune_fraction}")


def learnable_config(topology: TopologyConfig) -> LearnableConfig:
    """The settings a team file's ``topology.learning`` section gives (defaults if absent);
    temporal candidates by default when the team talks over several rounds."""
    fields = (topology.learning or TopologyLearningConfig()).model_dump()
    if fields["temporal"] is None:
        fields["temporal"] = topology.rounds > 1
    return LearnableConfig(**fields)


def candidate_edges(agents: Sequence[str], temporal: bool = False) -> list[Edge]:
    """Spatial ``agents[i] -> agents[j]`` for i < j, then (``temporal``) all pairs incl. self."""
    n = len(agents)
    edges = [(agents[i], agents[j], SPATIAL) for i in range(n) for j in range(i + 1, n)]
    if temporal:
        edges += [(u, v, TEMPORAL) for u in agents for v in agents]
    return edges


#: What :meth:`LearnableTopology.update` accepts per episode, with its utility.
SampleRef = Topology | torch.Tensor


class LearnableTopology:
    """Edge logits over a fixed candidate set, with sampling, REINFORCE updates and pruning."""

    def __init__(self, agents: Sequence[str], *, rounds: int = 1, final: str | None = None,
                 config: LearnableConfig | None = None) -> None:
        self.config = config or LearnableConfig()
        if self.config.temporal and rounds < 2:
            raise TopologyError("temporal candidates need rounds >= 2 (a single round has no "
                                "previous round to read)")
        self.agents = list(agents)
        self.rounds = rounds
        self.final = final if final is not None else self.agents[-1]
        Topology(self.agents, rounds=rounds, final=self.final, strict=False)  # validate names
        self.candidates = candidate_edges(self.agents, self.config.temporal)
        self._index = {e: i for i, e in enumerate(self.candidates)}
        self.theta = torch.nn.Parameter(
            torch.full((len(self.candidates),), float(self.config.init_logit)))
        self.active = torch.ones(len(self.candidates), dtype=torch.bool)
        self.optimizer = torch.optim.Adam([self.theta], lr=self.config.lr)
        self.steps = 0

    @classmethod
    def from_team(cls, cfg: TeamConfig, *, final: str | None = None,
                  config: LearnableConfig | None = None) -> LearnableTopology:
        """Candidates over the team's instances in role order, the decision agent (``final``,
        default the last one) moved to the end; settings from ``topology.learning``."""
        team = TeamLayout.from_roles(cfg.roles)
        final = team.agents[-1] if final is None else resolve_agent(final, team, "final")
        agents = [a for a in team.agents if a != final] + [final]
        config = config or learnable_config(cfg.topology)
        return cls(agents, rounds=cfg.topology.rounds, final=final, config=config)

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

    def mask_of(self, topology: Topology) -> torch.Tensor:
        mask = torch.zeros(len(self.candidates), dtype=torch.bool)
        for e in topology.edges:
            if e not in self._index:
                raise TopologyError(f"edge {e[0]!r} -> {e[1]!r} ({e[2]}) is not a candidate")
            mask[self._index[e]] = True
        return mask

    def sample(self, generator: torch.Generator | None = None) -> tuple[Topology, torch.Tensor]:
        """One graph for one episode and its log-probability (differentiable)."""
        mask = self.sample_masks(1, generator)[0]
        return self.topology_of(mask), self.log_prob(mask)

    def utility(self, score: float | torch.Tensor,
                cost: float | torch.Tensor) -> float | torch.Tensor:
        """R = score - lambda * cost, with lambda = ``config.cost_weight``; cost is e.g. the
        episode's ``topology.num_messages()`` or its message tokens."""
        return score - self.config.cost_weight * cost

    # ----- learning
    def update(self, samples: Sequence[tuple[SampleRef, float]]) -> dict[str, Any]:
        """One REINFORCE step from ``(topology | mask | log_prob, utility)`` per episode.

        Topologies and masks are scored under the current logits; a log-prob tensor (from
        :meth:`sample`) is used as is, so it must come from the same step.
        """
        if not samples:
            raise ValueError("update needs at least one (sample, utility) pair")
        logps = [self._log_prob_of(ref) for ref, _u in samples]
        utilities = torch.tensor([float(u) for _x, u in samples])
        return self._reinforce(torch.stack(logps), utilities)

    def _log_prob_of(self, ref: SampleRef) -> torch.Tensor:
        if isinstance(ref, Topology):
            return self.log_prob(self.mask_of(ref))
        return ref if ref.ndim == 0 else self.log_prob(ref)  # a log-prob, or a mask [E]

    def update_batch(self, masks: torch.Tensor, utilities: torch.Tensor,
                     groups: torch.Tensor | None = None) -> dict[str, Any]:
        """Vectorised :meth:`update`: masks ``[B, E]``, utilities ``[B]``; with ``groups``
        ``[B]`` the baseline is taken within each group (episodes of the same task), so task
        difficulty cancels out and only the graph's effect remains."""
        return self._reinforce(self.log_prob(masks), utilities.to(torch.float32), groups)

    def _reinforce(self, logp: torch.Tensor, utilities: torch.Tensor,
                   groups: torch.Tensor | None = None) -> dict[str, Any]:
        """loss = -(1/B) sum_b (R_b - baseline_b) * log P(a_b); one optimizer step; pruning."""
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
        pruned = (self.prune(c.prune_fraction, c.prune_threshold)
                  if c.prune_every and self.steps % c.prune_every == 0 else [])
        p = self.probs()[self.active]
        entropy = -(p * p.clamp_min(1e-12).log() + (1 - p) * (1 - p).clamp_min(1e-12).log())
        return {"step": self.steps, "loss": loss.item(), "utility": utilities.mean().item(),
                "advantage_std": advantage.std().item() if advantage.numel() > 1 else 0.0,
                "expected_edges": p.sum().item(), "entropy": entropy.sum().item(),
                "active": int(self.active.sum()), "pruned": pruned}

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

    def deploy(self, threshold: float = 0.5, top_k: int | None = None,
               strict: bool = False) -> Topology:
        """The edges with p_e > threshold, or (``top_k``) the k most likely remaining ones."""
        p = self.probs()
        if top_k is None:
            mask = self.active & (p > threshold)
        else:
            ranked = [i for i in p.argsort(descending=True, stable=True).tolist()
                      if self.active[i]]
            mask = torch.zeros_like(self.active)
            mask[ranked[:top_k]] = True
        topo = self.topology_of(mask)
        return topo if not strict else Topology(topo.agents, topo.edges, rounds=self.rounds,
                                                final=self.final, strict=True)

    # ----- persistence
    def state_dict(self) -> dict[str, Any]:
        """Logits, mask, optimizer and step count, for a trainer's checkpoint."""
        return {"theta": self.theta.detach().clone(), "active": self.active.clone(),
                "optimizer": self.optimizer.state_dict(), "steps": self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with torch.no_grad():
            self.theta.copy_(state["theta"])
        self.active = state["active"].clone()
        self.optimizer.load_state_dict(state["optimizer"])
        self.steps = int(state["steps"])

    def save(self, path: str | Path) -> None:
        """Logits and the pruning mask as safetensors; candidates and config in the metadata."""
        meta = {"format": FORMAT, "agents": json.dumps(self.agents), "rounds": str(self.rounds),
                "final": self.final, "candidates": json.dumps(self.candidates),
                "config": json.dumps(asdict(self.config)), "steps": str(self.steps)}
        save_file({"logits": self.theta.detach().contiguous(), "active": self.active},
                  str(path), metadata=meta)

    @classmethod
    def load(cls, path: str | Path) -> LearnableTopology:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            if meta.get("format") != FORMAT:
                raise ValueError(f"{path}: not a learnable topology file (format "
                                 f"{meta.get('format')!r}, expected {FORMAT!r})")
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (not a dict)
        topo = cls(json.loads(meta["agents"]), rounds=int(meta["rounds"]), final=meta["final"],
                   config=LearnableConfig(**json.loads(meta["config"])))
        stored = [tuple(e) for e in json.loads(meta["candidates"])]
        if stored != topo.candidates:
            raise ValueError(f"{path}: candidate edges differ from those of its agents/config")
        with torch.no_grad():
            topo.theta.copy_(tensors["logits"])
        topo.active = tensors["active"].clone()
        topo.steps = int(meta["steps"])
        return topo
