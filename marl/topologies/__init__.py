"""Communication topologies of a team: fixed graphs by kind, learnable ones, and pictures.

``build_topology(team_cfg)`` gives the configured :class:`Topology`; ``LearnableTopology``
learns edge probabilities by REINFORCE; ``marl.topologies.render`` draws either (Mermaid, PNG);
``marl.topologies.synthetic`` is a voting task with a known optimal graph.  This package uses
``configs`` only: the orchestrator and the trainer use it, never the reverse.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from marl.topologies.builders import (
    TeamLayout,
    build_topology,
    register_topology,
    topology_from_roles,
    topology_kinds,
)
from marl.topologies.graph import SPATIAL, TEMPORAL, Edge, Node, Topology, TopologyError

if TYPE_CHECKING:
    from marl.topologies.learnable import LearnableTopology, candidate_edges


def __getattr__(name: str) -> Any:
    """The learnable topology on first use (PEP 562): it needs torch, fixed graphs do not."""
    if name in ("LearnableTopology", "candidate_edges"):
        from marl.topologies import learnable

        return getattr(learnable, name)
    raise AttributeError(f"module 'marl.topologies' has no attribute {name!r}")


__all__ = [
    "SPATIAL",
    "TEMPORAL",
    "Edge",
    "LearnableTopology",
    "Node",
    "TeamLayout",
    "Topology",
    "TopologyError",
    "build_topology",
    "candidate_edges",
    "register_topology",
    "topology_from_roles",
    "topology_kinds",
]
