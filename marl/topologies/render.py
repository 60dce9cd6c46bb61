"""Pictures of topologies: Mermaid text and a PNG.

Both take a :class:`Topology` (every edge drawn at full width) or a learnable topology
(anything with ``agents``, ``final`` and ``edge_probabilities()``: each remaining candidate is
drawn with its probability as label and its width proportional to it).  Spatial edges are solid,
temporal edges (round t-1 -> t) dashed; the decision agent is outlined.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import networkx as nx

from marl.topologies.graph import SPATIAL, TEMPORAL, Edge, Topology

if TYPE_CHECKING:
    from matplotlib.axes import Axes


class EdgeDistribution(Protocol):
    agents: list[str]
    final: str

    def edge_probabilities(self) -> dict[Edge, float]: ...


Drawable = Topology | EdgeDistribution


def weighted_edges(obj: Drawable) -> tuple[list[str], str, dict[Edge, float | None]]:
    """(agents, decision agent, edge -> probability or None for a plain topology's edges)."""
    if isinstance(obj, Topology):
        return obj.agents, obj.final, dict.fromkeys(obj.edges)
    return obj.agents, obj.final, dict(obj.edge_probabilities())


def _width(p: float | None, scale: float) -> float:
    return scale if p is None else 0.5 + scale * p


def to_mermaid(obj: Drawable, direction: str = "LR") -> str:
    """Mermaid ``flowchart`` text; node ids are ``n<i>``, labels the agent names."""
    agents, final, edges = weighted_edges(obj)
    ids = {a: f"n{i}" for i, a in enumerate(agents)}
    lines = [f"flowchart {direction}"]
    lines += [f'    {ids[a]}["{a}"]' for a in agents]
    styles = []
    for i, ((src, dst, kind), p) in enumerate(edges.items()):
        label = " ".join(
            part
            for part in ("t-1" if kind == TEMPORAL else "", "" if p is None else f"p={p:.2f}")
            if part
        )
        arrow = "-.->" if kind == TEMPORAL else "-->"
        lines.append(f"    {ids[src]} {arrow}" + (f'|"{label}"|' if label else "") + f" {ids[dst]}")
        if p is not None:
            styles.append(f"    linkStyle {i} stroke-width:{_width(p, 4.0):.1f}px")
    lines += styles
    lines += ["    classDef decision stroke-width:3px", f"    class {ids[final]} decision"]
    return "\n".join(lines) + "\n"


def _layout(agents: list[str], edges: dict[Edge, float | None]) -> dict[str, tuple[float, float]]:
    """Agents left to right by spatial depth (longest path from a source), stacked per depth."""
    spatial = nx.DiGraph([(u, v) for u, v, k in edges if k == SPATIAL])
    spatial.add_nodes_from(agents)
    depth = dict.fromkeys(agents, 0)
    for node in nx.topological_sort(spatial):
        for nxt in spatial.successors(node):
            depth[nxt] = max(depth[nxt], depth[node] + 1)
    for a in agents:
        spatial.nodes[a]["layer"] = depth[a]
    return nx.multipartite_layout(spatial, subset_key="layer")


def draw_png(obj: Drawable, path: str | Path, title: str | None = None, dpi: int = 120) -> Path:
    """Draw the topology to a PNG file (edge widths ~ probabilities); returns the path."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    agents, final, edges = weighted_edges(obj)
    pos = _layout(agents, edges)
    columns = len({x for x, _y in pos.values()})
    rows = max(sum(1 for x2, _y in pos.values() if x2 == x) for x, _y in pos.values())
    fig = Figure(figsize=(1.5 + 1.6 * columns, 1.6 + 1.1 * rows))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.set_axis_off()
    ax.margins(x=0.08, y=0.35)
    nodes = nx.DiGraph()
    nodes.add_nodes_from(agents)
    nx.draw_networkx_nodes(
        nodes,
        pos,
        ax=ax,
        node_color="#dbe9f6",
        edgecolors=["black" if a == final else "#5b7a99" for a in agents],
        linewidths=[2.5 if a == final else 1.0 for a in agents],
        node_size=1400,
    )
    nx.draw_networkx_labels(nodes, pos, ax=ax, font_size=9)
    _draw_edges(ax, pos, edges)
    if title:
        ax.set_title(title)
    path = Path(path)
    fig.savefig(path, dpi=dpi, bbox_inches="tight")
    return path


def _draw_edges(
    ax: Axes, pos: dict[str, tuple[float, float]], edges: dict[Edge, float | None]
) -> None:
    """Spatial edges solid, temporal ones dashed and bent further; labels where p is known."""
    for kind, style, color, bend in (
        (SPATIAL, "solid", "#222222", 0.25),
        (TEMPORAL, "dashed", "#2b6cb0", 0.5),
    ):
        sub = {(u, v): p for (u, v, k), p in edges.items() if k == kind}
        if not sub:
            continue
        g = nx.DiGraph(list(sub))
        nx.draw_networkx_edges(
            g,
            pos,
            ax=ax,
            edgelist=list(sub),
            style=style,
            edge_color=color,
            width=[_width(p, 3.0) for p in sub.values()],
            connectionstyle=f"arc3,rad={bend}",
            node_size=1400,
            arrowsize=14,
        )
        labels = {e: f"{p:.2f}" for e, p in sub.items() if p is not None}
        if labels:
            nx.draw_networkx_edge_labels(
                g,
                pos,
                edge_labels=labels,
                ax=ax,
                font_size=7,
                font_color=color,
                connectionstyle=f"arc3,rad={bend}",
            )
