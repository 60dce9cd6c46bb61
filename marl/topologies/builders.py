"""Topology builders by ``topology.kind``, and :func:`build_topology` for a team config.

A builder maps the config (between role names) and the team's instances to edges between
instance names; a role with ``count: 2`` contributes both instances everywhere it is named.
Temporal edges are only kept when ``rounds > 1``.  Conventions, ``A`` = agents in role order:

================  ==========================================  ===============================
kind              spatial (within a round)                    temporal (round t-1 -> t)
================  ==========================================  ===============================
chain             A[0] -> A[1] -> ... -> A[-1]                A[-1] -> A[0]
star              every leaf -> hub                           hub -> every leaf
complete          A[i] -> A[j] for i < j                      everyone -> everyone (incl. self)
debate            none                                        everyone -> everyone (incl. self)
layered           every agent of layer k -> of layer k+1      last layer -> first layer
explicit          the config's [src, dst] role pairs          sinks -> sources of those edges
                                                              (or ``temporal_edges`` if given)
================  ==========================================  ===============================

``explicit`` pairs may name agent instances (``solver_1``) as well as roles, so a learned graph
over instances is written back exactly (edges + temporal_edges).

The temporal feedback of chain / layered / explicit (end of the round -> its start) lets a
pipeline iterate: in round 2 the first agent reads the last agent's round-1 output.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import product

from marl.config.schema import RoleConfig, TeamConfig, TopologyConfig
from marl.topologies.graph import SPATIAL, TEMPORAL, Edge, Topology, TopologyError


@dataclass(frozen=True)
class TeamLayout:
    """Role name -> instance names, in config order."""

    roles: dict[str, list[str]]

    @classmethod
    def from_roles(cls, roles: Sequence[RoleConfig]) -> TeamLayout:
        return cls({r.name: r.instance_names() for r in roles})

    @property
    def agents(self) -> list[str]:
        return [a for names in self.roles.values() for a in names]

    def expand(self, role: str, where: str) -> list[str]:
        """Instances of ``role``; ``where`` (e.g. ``topology.hub``) locates it in the error."""
        try:
            return self.roles[role]
        except KeyError:
            raise TopologyError(
                f"{where}: unknown role {role!r}; known roles: {', '.join(self.roles)}"
            ) from None


Builder = Callable[[TopologyConfig, TeamLayout], list[Edge]]
_BUILDERS: dict[str, Builder] = {}


def register_topology(kind: str) -> Callable[[Builder], Builder]:
    """``@register_topology("chain")`` on ``builder(cfg, team) -> [(src, dst, kind), ...]``."""

    def deco(builder: Builder) -> Builder:
        if kind in _BUILDERS and _BUILDERS[kind] is not builder:
            raise ValueError(f"topology kind {kind!r} is already registered")
        _BUILDERS[kind] = builder
        return builder

    return deco


def topology_kinds() -> list[str]:
    return sorted(_BUILDERS)


def _all_to_all(srcs: Sequence[str], dsts: Sequence[str], kind: str) -> list[Edge]:
    return [(s, d, kind) for s, d in product(srcs, dsts)]


def _feedback(spatial: Sequence[Edge], agents: Sequence[str]) -> list[Edge]:
    """Temporal edges from the sinks of the spatial DAG to its sources, among ``agents``."""
    has_in = {d for _s, d, _k in spatial}
    has_out = {s for s, _d, _k in spatial}
    sinks = [a for a in agents if a not in has_out]
    sources = [a for a in agents if a not in has_in]
    return _all_to_all(sinks, sources, TEMPORAL)


@register_topology("chain")
def chain(cfg: TopologyConfig, team: TeamLayout) -> list[Edge]:
    a = team.agents
    spatial = [(u, v, SPATIAL) for u, v in zip(a, a[1:], strict=False)]
    return spatial + _feedback(spatial, a)


@register_topology("star")
def star(cfg: TopologyConfig, team: TeamLayout) -> list[Edge]:
    hubs = team.expand(cfg.hub or "", "topology.hub")
    if len(hubs) != 1:
        raise TopologyError(
            f"topology.hub: role {cfg.hub!r} has {len(hubs)} agents "
            f"({', '.join(hubs)}); a star needs a hub role with count 1"
        )
    leaves = [a for a in team.agents if a not in hubs]
    return _all_to_all(leaves, hubs, SPATIAL) + _all_to_all(hubs, leaves, TEMPORAL)


@register_topology("complete")
def complete(cfg: TopologyConfig, team: TeamLayout) -> list[Edge]:
    a = team.agents
    spatial = [(a[i], a[j], SPATIAL) for i in range(len(a)) for j in range(i + 1, len(a))]
    return spatial + _all_to_all(a, a, TEMPORAL)


@register_topology("debate")
def debate(cfg: TopologyConfig, team: TeamLayout) -> list[Edge]:
    a = team.agents
    if cfg.rounds < 2 and len(a) > 1:
        raise TopologyError(
            "topology.rounds: a debate needs rounds >= 2 (agents answer alone "
            "in round 1 and read everyone's previous answers from round 2 on); "
            f"got rounds: {cfg.rounds}"
        )
    return _all_to_all(a, a, TEMPORAL)


@register_topology("layered")
def layered(cfg: TopologyConfig, team: TeamLayout) -> list[Edge]:
    layers = [
        [a for j, role in enumerate(layer) for a in team.expand(role, f"topology.layers[{i}][{j}]")]
        for i, layer in enumerate(cfg.layers or [])
    ]
    placed = {a for layer in layers for a in layer}
    missing = [r for r, names in team.roles.items() if not placed & set(names)]
    if missing:
        raise TopologyError(
            f"topology.layers: roles in no layer: {', '.join(missing)}; add "
            "each role of the team to one layer"
        )
    spatial = [
        e
        for up, down in zip(layers, layers[1:], strict=False)
        for e in _all_to_all(up, down, SPATIAL)
    ]
    return spatial + _all_to_all(layers[-1], layers[0], TEMPORAL)


def _role_or_agent(name: str, team: TeamLayout, where: str) -> list[str]:
    return [name] if name in team.agents and name not in team.roles else team.expand(name, where)


def _pairs(pairs: Sequence[tuple[str, str]], team: TeamLayout, field: str, kind: str) -> list[Edge]:
    return [
        e
        for i, (src, dst) in enumerate(pairs)
        for e in _all_to_all(
            _role_or_agent(src, team, f"topology.{field}[{i}][0]"),
            _role_or_agent(dst, team, f"topology.{field}[{i}][1]"),
            kind,
        )
    ]


@register_topology("explicit")
def explicit(cfg: TopologyConfig, team: TeamLayout) -> list[Edge]:
    spatial = _pairs(cfg.edges or [], team, "edges", SPATIAL)
    if cfg.temporal_edges is not None:
        return spatial + _pairs(cfg.temporal_edges, team, "temporal_edges", TEMPORAL)
    mentioned = {n for s, d, _k in spatial for n in (s, d)}
    return spatial + _feedback(spatial, [a for a in team.agents if a in mentioned])


def build_edges(cfg: TopologyConfig, team: TeamLayout) -> list[Edge]:
    """The registered builder's edges (temporal ones dropped for a single round)."""
    try:
        builder = _BUILDERS[cfg.kind]
    except KeyError:
        raise TopologyError(
            f"topology.kind: unknown kind {cfg.kind!r}; known kinds: {', '.join(topology_kinds())}"
        ) from None
    edges = builder(cfg, team)
    return edges if cfg.rounds > 1 else [e for e in edges if e[2] == SPATIAL]


def resolve_agent(name: str, team: TeamLayout, where: str) -> str:
    """An instance name, or a role name with a single instance, -> the instance name."""
    if name in team.agents:
        return name
    instances = team.expand(name, where)
    if len(instances) != 1:
        raise TopologyError(
            f"{where}: role {name!r} has {len(instances)} agents; name one of "
            f"{', '.join(instances)}"
        )
    return instances[0]


def build_topology(cfg: TeamConfig, *, final: str | None = None, strict: bool = True) -> Topology:
    """The team's configured topology over its agent instances.

    ``final`` (an agent or single-instance role) is the decision agent; by default
    ``topology.final``, else the last agent to speak in the last round.  ``strict`` is relaxed
    by ``topology.prune`` and by ``decision: vote`` (every agent's last answer is used, not
    only what reaches the final agent).  Raises :class:`TopologyError` with an actionable
    message.
    """
    return topology_from_roles(cfg.topology, cfg.roles, final=final, strict=strict)


def topology_from_roles(
    cfg: TopologyConfig,
    roles: Sequence[RoleConfig],
    *,
    final: str | None = None,
    strict: bool = True,
) -> Topology:
    """:func:`build_topology` from its parts (a topology section and the roles)."""
    team = TeamLayout.from_roles(roles)
    edges = build_edges(cfg, team)
    final = cfg.final if final is None else final
    strict = strict and not cfg.prune and cfg.decision == "final"
    if final is not None:
        final = resolve_agent(final, team, "final")
    return Topology(team.agents, edges, rounds=cfg.rounds, final=final, strict=strict)
