"""A cooperative voting task with scripted agents of known reliabilities.

It gives topology learning a ground truth: the expected utility of every deterministic graph is
computed exactly (enumerating the agents' 2^n correct/wrong outcomes), so the optimal edge set
is known and a learner can be checked against it.

Rules, agents in their fixed speaking order, the last one deciding:

- agent i's own answer is correct with probability r_i (independently); vote v_i = +1 / -1;
- agent j outputs ``sign(w_j v_j + sum_{i -> j} w_i out_i)`` (its own answer on a tie), where
  ``w_i = log(r_i / (1 - r_i))`` is the sender's log-odds: a weighted majority that trusts
  each message as much as its sender's own reliability;
- the team scores 1 when the final agent's output is correct;
- every edge of the graph costs ``cost`` (a message is paid for whether or not it changes
  anything, so the optimal edge set is unique): ``U(G) = P(correct | G) - cost * |G|``.

Messages from reliable agents help; a weak agent's message (or a relay through another agent)
adds less accuracy than it costs.  :data:`DEFAULT_TASK` is tuned so that the optimum is a
strict subset of the candidates, with a clear margin over every other graph.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from marl.topologies.graph import SPATIAL, Edge, Topology, TopologyError
from marl.topologies.learnable import LearnableTopology

_TIE = 1e-9


@dataclass(frozen=True)
class VotingTask:
    """Agents (speaking order, last decides), their reliabilities, and the cost per message."""

    agents: tuple[str, ...]
    reliabilities: tuple[float, ...]
    cost: float  # lambda: utility lost per message

    def __post_init__(self) -> None:
        if len(self.agents) != len(self.reliabilities):
            raise ValueError("one reliability per agent")
        if not all(0.5 < r < 1.0 for r in self.reliabilities):
            raise ValueError("reliabilities must lie in (0.5, 1)")

    @property
    def final(self) -> str:
        return self.agents[-1]

    @property
    def weights(self) -> torch.Tensor:
        r = torch.tensor(self.reliabilities, dtype=torch.float64)
        return torch.log(r / (1 - r))

    def _incoming(self, candidates: Sequence[Edge]) -> list[list[tuple[int, int]]]:
        """Per agent j: (edge index, sender index) of its candidate in-edges."""
        pos = {a: i for i, a in enumerate(self.agents)}
        incoming: list[list[tuple[int, int]]] = [[] for _ in self.agents]
        for e, (src, dst, kind) in enumerate(candidates):
            if kind != SPATIAL or pos.get(src, len(pos)) >= pos.get(dst, -1):
                raise TopologyError(
                    f"voting task: edge {src!r} -> {dst!r} ({kind}) must be "
                    "spatial and follow the agent order"
                )
            incoming[pos[dst]].append((e, pos[src]))
        return incoming

    def decide(
        self, masks: torch.Tensor, correct: torch.Tensor, candidates: Sequence[Edge]
    ) -> torch.Tensor:
        """Is the final output correct?  masks ``[B, E]``, own answers ``correct [B, n]``."""
        w = self.weights
        vote = correct.to(torch.float64) * 2 - 1
        out = vote.clone()
        for j, edges in enumerate(self._incoming(candidates)):
            total = w[j] * vote[:, j]
            for e, i in edges:
                total = total + masks[:, e].to(torch.float64) * w[i] * out[:, i]
            out[:, j] = torch.where(total.abs() < _TIE, vote[:, j], total.sign())
        return out[:, -1] > 0

    def play(
        self,
        masks: torch.Tensor,
        candidates: Sequence[Edge],
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One episode per mask: (score in {0, 1}, messages = number of edges)."""
        r = torch.tensor(self.reliabilities, dtype=torch.float64)
        correct = (
            torch.rand(masks.shape[0], len(self.agents), generator=generator, dtype=torch.float64)
            < r
        )
        score = self.decide(masks, correct, candidates).to(torch.float64)
        return score, masks.sum(-1).to(torch.float64)

    def expected_utility(self, masks: torch.Tensor, candidates: Sequence[Edge]) -> torch.Tensor:
        """Exact E[score] - cost * |G| per mask ``[M, E]``, over all 2^n outcomes."""
        n = len(self.agents)
        outcomes = torch.tensor(list(itertools.product([False, True], repeat=n)))
        r = torch.tensor(self.reliabilities, dtype=torch.float64)
        prob = torch.where(outcomes, r, 1 - r).prod(-1)  # [2^n]
        m, k = masks.shape[0], outcomes.shape[0]
        wins = self.decide(masks.repeat_interleave(k, 0), outcomes.repeat(m, 1), candidates)
        accuracy = (wins.view(m, k).to(torch.float64) * prob).sum(-1)
        return accuracy - self.cost * masks.sum(-1).to(torch.float64)

    def all_masks(self, candidates: Sequence[Edge]) -> torch.Tensor:
        return torch.tensor(list(itertools.product([False, True], repeat=len(candidates))))

    def optimum(self, candidates: Sequence[Edge]) -> tuple[list[Edge], float, float]:
        """(optimal edge set, its utility, the best utility of any other edge set)."""
        masks = self.all_masks(candidates)
        utility = self.expected_utility(masks, candidates)
        best, second = utility.topk(2).indices.tolist()
        edges = [e for e, on in zip(candidates, masks[best].tolist(), strict=True) if on]
        return edges, utility[best].item(), utility[second].item()

    def run(self, topology: Topology, correct: dict[str, bool]) -> bool:
        """The same rules played node by node along ``topology.order()`` (one round): what an
        orchestrator does, reading each agent's inputs from ``topology.predecessors``."""
        w = dict(zip(self.agents, self.weights.tolist(), strict=True))
        out: dict[str, float] = {}
        for agent, rnd in topology.order():
            own = 1.0 if correct[agent] else -1.0
            total = w[agent] * own + sum(
                w[a] * out[a] for a, _r in topology.predecessors(agent, rnd)
            )
            out[agent] = own if abs(total) < _TIE else math.copysign(1.0, total)
        return out[topology.final] > 0


#: Five agents; with cost 0.03 per message the optimum of the 2^10 spatial graphs is
#: {a -> e, b -> e} (utility 0.852): the two strong senders out-vote the decider's own errors,
#: while c's and d's messages and every relay cost more than they add.  Every other edge set is
#: at least 0.03 worse.
DEFAULT_TASK = VotingTask(
    agents=("a", "b", "c", "d", "e"), reliabilities=(0.85, 0.8, 0.65, 0.6, 0.8), cost=0.03
)


def fit(
    task: VotingTask,
    topology: LearnableTopology,
    updates: int,
    batch_size: int,
    generator: torch.Generator | None = None,
) -> list[dict]:
    """Train ``topology`` alone on ``task``: each update samples ``batch_size`` graphs, plays
    one episode on each and takes one REINFORCE step on R = score - lambda * messages."""
    history = []
    for _ in range(updates):
        masks = topology.sample_masks(batch_size, generator)
        score, messages = task.play(masks, topology.candidates, generator)
        history.append(topology.update_batch(masks, score - task.cost * messages))
    return history
