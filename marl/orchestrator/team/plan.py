"""The executable form of a topology: the unrolled DAG of ``(agent, round)`` nodes, its
topological generations, and the decision (the final node, or a majority vote).

Every node of a generation only depends on earlier generations, so the runtime sends all nodes
of one generation that share a policy as one batch.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

import networkx as nx

from marl.games.tasks import final_integer
from marl.orchestrator.team.errors import TeamError
from marl.topologies import Topology
from marl.topologies.graph import Node

#: The majority vote's name: ``TeamResult.decided_by`` and its LangGraph node (agent nodes
#: end in ``_r<round>``, so it never clashes with one).
VOTE_NODE = "vote"


@dataclass(frozen=True)
class Plan:
    """A topology unrolled for execution: the DAG, its generations, and the decision.

    ``decision == "final"``: the pruned DAG (nodes that reach the final node), ended by it.
    ``decision == "vote"``: every agent's last-round node votes; the DAG is what reaches them.
    """

    topology: Topology
    decision: str
    dag: nx.DiGraph
    generations: tuple[tuple[Node, ...], ...]
    preds: Mapping[Node, tuple[Node, ...]]
    final: Node | None
    voters: tuple[Node, ...]

    @classmethod
    def of(cls, topology: Topology, decision: str = "final") -> Plan:
        index = {a: i for i, a in enumerate(topology.agents)}

        def key(n: Node) -> tuple[int, int]:
            return n[1], index[n[0]]

        if decision == "final":
            dag, final, voters = topology.unroll(), topology.final_node, ()
        elif decision == "vote":
            full = topology.unroll(prune=False)
            voters = tuple((a, topology.rounds - 1) for a in topology.agents)
            live = set(voters).union(*(nx.ancestors(full, v) for v in voters))
            dag, final = full.subgraph(live).copy(), None
        else:
            raise TeamError(f"unknown decision {decision!r}; use 'final' or 'vote'")
        generations = tuple(tuple(sorted(g, key=key)) for g in nx.topological_generations(dag))
        preds = {n: tuple(sorted(dag.predecessors(n), key=key)) for n in dag}
        return cls(topology, decision, dag, generations, preds, final, voters)

    @property
    def order(self) -> list[Node]:
        """Execution order: generation by generation."""
        return [n for g in self.generations for n in g]

    @property
    def agents(self) -> list[str]:
        """Agents that speak at least once, in the topology's agent order."""
        running = {a for a, _r in self.dag}
        return [a for a in self.topology.agents if a in running]

    @property
    def messages(self) -> int:
        return self.dag.number_of_edges()


# ----- decision by vote
def answer_key(text: str) -> str:
    """What a vote compares: the integer the text commits to, else its normalised words."""
    number = final_integer(text)
    if number is not None:
        return f"int:{number}"
    return " ".join(text.lower().split()).strip(" .!")


def majority(answers: Mapping[str, str]) -> str:
    """The agent whose answer wins the vote (ties: the first in ``answers``' order).

    Empty answers only win when every answer is empty."""
    if not answers:
        raise TeamError("a vote needs at least one answer")
    keys = {a: answer_key(t) for a, t in answers.items()}
    counts = Counter(k for k in keys.values() if k) or Counter(keys.values())
    best = max(counts.values())
    return next(a for a, k in keys.items() if counts.get(k) == best)
