"""Communication topologies: who hears whom, within a round and across rounds.

A topology is a graph over agent instance names whose edges carry ``kind``:

- ``spatial``: ``a -> b`` inside one round (b speaks after a and reads a's message); the
  spatial edges of a round must form a DAG;
- ``temporal``: ``a -> b`` from round ``t - 1`` to round ``t`` (b reads what a said in the
  previous round); no acyclicity constraint, self-edges allowed (an agent re-reads itself).

The graph is a :class:`networkx.MultiDiGraph` (a ``DiGraph`` subclass) keyed by kind, because
the same pair may be linked both ways at once (``complete``: ``a -> b`` spatial *and* temporal).

:meth:`Topology.unroll` turns ``R`` rounds into one DAG of ``(agent, round)`` nodes, which is
what an orchestrator executes in :meth:`Topology.order`.  The *decision node* is
``(final, R - 1)``.  Every agent's first-round node must reach it (otherwise that agent never
influences the decision and the topology is rejected, naming the agents); later nodes that
cannot reach it (e.g. the other debaters' answers in the last round of a debate, which would
come after the decision) are pruned from the unrolled DAG.  ``strict=False`` prunes instead of
rejecting: sampled and learned graphs use it, since cutting an agent off is how they save cost.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

import networkx as nx
import yaml

SPATIAL = "spatial"
TEMPORAL = "temporal"
EdgeKind = Literal["spatial", "temporal"]
KINDS: tuple[str, ...] = (SPATIAL, TEMPORAL)

#: (src, dst, kind) between agent instance names.
Edge = tuple[str, str, str]
#: (agent, round): a node of the unrolled DAG.
Node = tuple[str, int]


class TopologyError(ValueError):
    """A topology that cannot run; the message says what to change."""


def node_name(node: Node) -> str:
    """``('critic', 1)`` -> ``'critic@1'``: how nodes of the unrolled DAG appear in messages."""
    return f"{node[0]}@{node[1]}"


def format_cycle(cycle: Sequence[str]) -> str:
    """``['a', 'b', 'c']`` -> ``'a -> b -> c -> a'``."""
    return " -> ".join([*cycle, cycle[0]])


class Topology:
    """A communication graph over ``agents`` for ``rounds`` rounds, with its decision agent.

    ``agents`` fixes the order used to break ties (topological orders, the default decision
    agent); edges are ``(src, dst, kind)`` triples.  Construction validates everything and
    raises :class:`TopologyError`: unknown agent, unknown kind, spatial cycle, unknown final
    agent, and (``strict``) agents that never reach the decision node.
    """

    def __init__(
        self,
        agents: Sequence[str],
        edges: Iterable[Edge] = (),
        *,
        rounds: int = 1,
        final: str | None = None,
        strict: bool = True,
    ) -> None:
        if rounds < 1:
            raise TopologyError(f"rounds must be >= 1, got {rounds}")
        dupes = sorted(a for a, n in Counter(agents).items() if n > 1)
        if dupes:
            raise TopologyError(f"duplicate agent names: {', '.join(dupes)}")
        if not agents:
            raise TopologyError("a topology needs at least one agent")
        self.agents: list[str] = list(agents)
        self.rounds = rounds
        self.strict = strict
        self._index = {a: i for i, a in enumerate(self.agents)}
        self.graph = nx.MultiDiGraph()
        self.graph.add_nodes_from(self.agents)
        for src, dst, kind in edges:
            self._check_edge(src, dst, kind)
            self.graph.add_edge(src, dst, key=kind, kind=kind)
        self._check_spatial_dag()
        if final is None:
            final = self.round_order()[-1]
        elif final not in self._index:
            raise TopologyError(
                f"final agent {final!r} is not in the topology; agents: {', '.join(self.agents)}"
            )
        self.final = final
        self._full = self._unroll_full()
        live = nx.ancestors(self._full, self.final_node) | {self.final_node}
        cut = [a for a in self.agents if (a, 0) not in live]
        if strict and cut:
            raise TopologyError(
                f"{', '.join(node_name((a, 0)) for a in cut)} never reach the decision node "
                f"{node_name(self.final_node)}: add edges (a path) from them to {self.final!r}"
                + (
                    ", temporal edges to carry round-0 messages into later rounds"
                    if rounds > 1
                    else ""
                )
                + ", choose another final agent, or remove them from the team"
            )
        self._live = self._full.subgraph(live).copy()

    # ----- construction helpers
    def _check_edge(self, src: str, dst: str, kind: str) -> None:
        for name in (src, dst):
            if name not in self._index:
                raise TopologyError(
                    f"edge {src!r} -> {dst!r}: unknown agent {name!r}; known "
                    f"agents: {', '.join(self.agents)}"
                )
        if kind not in KINDS:
            raise TopologyError(
                f"edge {src!r} -> {dst!r}: unknown kind {kind!r}; use one of {', '.join(KINDS)}"
            )

    def _check_spatial_dag(self) -> None:
        spatial = nx.DiGraph(self.spatial_edges)
        try:
            cycle = nx.find_cycle(spatial)
        except nx.NetworkXNoCycle:
            return
        raise TopologyError(
            f"spatial edges form a cycle: {format_cycle([u for u, _v in cycle])}; a round must "
            "be a DAG: remove one of these edges or make it temporal (to the next round)"
        )

    def _unroll_full(self) -> nx.DiGraph:
        dag = nx.DiGraph()
        for r in range(self.rounds):
            dag.add_nodes_from(((a, r) for a in self.agents), round=r)
            dag.add_edges_from((((u, r), (v, r)) for u, v in self.spatial_edges), kind=SPATIAL)
            if r > 0:
                dag.add_edges_from(
                    (((u, r - 1), (v, r)) for u, v in self.temporal_edges), kind=TEMPORAL
                )
        return dag

    # ----- views
    def _edges(self, kind: str) -> list[tuple[str, str]]:
        return [(u, v) for u, v, k in self.graph.edges(keys=True) if k == kind]

    @property
    def spatial_edges(self) -> list[tuple[str, str]]:
        return self._edges(SPATIAL)

    @property
    def temporal_edges(self) -> list[tuple[str, str]]:
        return self._edges(TEMPORAL)

    @property
    def edges(self) -> list[Edge]:
        return [(u, v, k) for u, v, k in self.graph.edges(keys=True)]

    @property
    def final_node(self) -> Node:
        """The decision node: the final agent in the last round."""
        return (self.final, self.rounds - 1)

    def round_order(self) -> list[str]:
        """Agents in the order they speak within a round (ties broken by agent order)."""
        spatial = nx.DiGraph(self.spatial_edges)
        spatial.add_nodes_from(self.agents)
        return list(nx.lexicographical_topological_sort(spatial, key=self._index.__getitem__))

    def unroll(self, prune: bool = True) -> nx.DiGraph:
        """The DAG of ``(agent, round)`` nodes; edge attr ``kind``, node attr ``round``.

        ``prune`` (default) keeps only nodes that reach the decision node: what actually runs.
        """
        return (self._live if prune else self._full).copy()

    def order(self) -> list[Node]:
        """Topological order of the (pruned) unrolled DAG: round by round, then speaking order."""
        return list(
            nx.lexicographical_topological_sort(self._live, key=lambda n: (n[1], self._index[n[0]]))
        )

    def predecessors(self, agent: str, round: int) -> list[Node]:
        """Whose messages ``agent`` reads in ``round``: temporal ones (round - 1) first."""
        node = (agent, round)
        if node not in self._full:
            raise KeyError(
                f"no node {node_name(node)}: agents {', '.join(self.agents)}, "
                f"rounds 0..{self.rounds - 1}"
            )
        return sorted(self._full.predecessors(node), key=lambda n: (n[1], self._index[n[0]]))

    @property
    def pruned_agents(self) -> list[str]:
        """Agents that never run (no node of theirs reaches the decision node)."""
        running = {a for a, _r in self._live}
        return [a for a in self.agents if a not in running]

    def num_messages(self) -> int:
        """Messages sent per episode: edges of the pruned unrolled DAG."""
        return self._live.number_of_edges()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Topology):
            return NotImplemented
        return (self.agents, self.rounds, self.final, sorted(self.edges)) == (
            other.agents,
            other.rounds,
            other.final,
            sorted(other.edges),
        )

    def __repr__(self) -> str:
        return (
            f"Topology(agents={self.agents}, rounds={self.rounds}, final={self.final!r}, "
            f"spatial={self.spatial_edges}, temporal={self.temporal_edges})"
        )

    # ----- (de)serialisation
    def to_yaml_edges(self) -> list[list[str]]:
        """``[src, dst]`` for spatial edges, ``[src, dst, 'temporal']`` for temporal ones."""
        return [[u, v] if k == SPATIAL else [u, v, k] for u, v, k in self.edges]

    @classmethod
    def from_edges(
        cls,
        edges: Iterable[Sequence[str]],
        *,
        agents: Sequence[str] | None = None,
        rounds: int = 1,
        final: str | None = None,
        strict: bool = True,
    ) -> Topology:
        """Inverse of :meth:`to_yaml_edges`; ``agents`` defaults to their order of appearance."""
        triples: list[Edge] = []
        for e in edges:
            if len(e) not in (2, 3):
                raise TopologyError(f"edge {list(e)!r}: write [src, dst] or [src, dst, kind]")
            triples.append((e[0], e[1], e[2] if len(e) == 3 else SPATIAL))
        if agents is None:
            agents = list(dict.fromkeys(n for u, v, _k in triples for n in (u, v)))
        return cls(agents, triples, rounds=rounds, final=final, strict=strict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "agents": list(self.agents),
            "rounds": self.rounds,
            "final": self.final,
            "strict": self.strict,
            "edges": self.to_yaml_edges(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Topology:
        return cls.from_edges(
            data.get("edges", []),
            agents=data["agents"],
            rounds=data.get("rounds", 1),
            final=data.get("final"),
            strict=data.get("strict", True),
        )

    def save_yaml(self, path: str | Path) -> None:
        Path(path).write_text(
            yaml.safe_dump(self.to_dict(), sort_keys=False, default_flow_style=None)
        )

    @classmethod
    def load_yaml(cls, path: str | Path) -> Topology:
        return cls.from_dict(yaml.safe_load(Path(path).read_text()))
