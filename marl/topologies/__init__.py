"""Communication topologies of a team: fixed graphs by kind, learnable ones, and pictures.

``build_topology(team_cfg)`` gives the configured :class:`Topology`; ``LearnableTopology``
learns edge probabilities by REINFORCE; ``marl.topologies.render`` draws either (Mermaid, PNG);
``marl.topologies.synthetic`` is a voting task with a known optimal graph.  This package uses
``configs`` only: the orchestrator and the trainer use it, never the reverse.
"""

from marl.topologies.builders import (
    TeamLayout,
    build_topology,
    register_topology,
    topology_from_roles,
    topology_kinds,
)
from marl.topologies.graph import SPATIAL, TEMPORAL, Edge, Node, Topology, TopologyError
from marl.topologies.learnable import LearnableTopology, candidate_edges

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
