"""The model card of an exported team (its ``README.md``): what the team is, its graph, how
it trained (from the manifest's summary of ``metrics.jsonl``), and how to use it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from marl.config import TeamConfig
from marl.infra.layout import TOPOLOGY_FILE
from marl.topologies import LearnableTopology, Topology
from marl.topologies.render import to_mermaid


def _fmt(x: Any) -> str:
    return f"{x:.3f}" if isinstance(x, float) else ("" if x is None else str(x))


def model_card(
    cfg: TeamConfig,
    topology: Topology,
    manifest: dict[str, Any],
    learned: LearnableTopology | None = None,
    threshold: float = 0.5,
) -> str:
    """A short README: what the team is, its graph, how it trained, how to use it."""
    lines = ["---", "library_name: peft", "tags: [marl-teams, multi-agent, lora]", "---", ""]
    lines += [f"# {cfg.name}", ""]
    if cfg.description:
        lines += [cfg.description, ""]
    step = manifest.get("step")
    lines += [
        f"A marl-teams team exported from `{Path(manifest['source']).name}`"
        + (f" at training step {step}." if step is not None else "."),
        "",
    ]
    lines += roles_section(cfg)
    lines += topology_section(cfg, topology, learned, threshold)
    lines += training_section(manifest.get("training") or {})
    lines += use_section(cfg)
    return "\n".join(lines)


def roles_section(cfg: TeamConfig) -> list[str]:
    lines = [
        "## Roles",
        "",
        "| role | agents | base model | LoRA adapter | decoding |",
        "|---|---|---|---|---|",
    ]
    for r in cfg.roles:
        lora = f"r={r.adapter.r}, alpha={r.adapter.alpha}" if r.adapter else "none (frozen)"
        dec = f"{r.decoding.mode}, T={r.decoding.temperature}"
        lines.append(
            f"| {r.name} | {', '.join(r.instance_names())} | `{r.model}` | {lora} | {dec} |"
        )
    return lines


def topology_section(
    cfg: TeamConfig, topology: Topology, learned: LearnableTopology | None, threshold: float
) -> list[str]:
    t = cfg.topology
    decision = (
        "majority vote over the last round's answers"
        if t.decision == "vote"
        else f"`{topology.final}` gives the final answer"
    )
    lines = [
        "",
        "## Topology",
        "",
        f"{t.rounds} round(s); {decision}; {topology.num_messages()} messages per task.",
    ]
    if learned is not None:
        kept = len(topology.edges)
        lines.append(
            f"Learned: {kept} of {len(learned.candidates)} candidate edges kept "
            f"(p > {threshold:g} after {learned.steps} updates); probabilities in "
            f"`{TOPOLOGY_FILE}`."
        )
    if topology.pruned_agents:
        lines.append(f"Never consulted (pruned): {', '.join(topology.pruned_agents)}.")
    return [*lines, "", "```mermaid", to_mermaid(topology).rstrip(), "```", ""]


def training_section(summary: dict[str, Any]) -> list[str]:
    """The manifest's training summary: steps, exploitability first to last, final rewards."""
    lines = ["## Training", ""]
    if not summary:
        return [*lines, "No metrics.jsonl was found next to the checkpoint.", ""]
    lines += [f"- steps: {summary['steps']}"]
    expl = summary.get("exploitability")
    if expl:
        lines.append(
            f"- exploitability: {_fmt(expl['first']['value'])} (step "
            f"{expl['first']['step']}) -> {_fmt(expl['last']['value'])} (step "
            f"{expl['last']['step']})"
        )
    if summary["rewards"]:
        lines += [
            "",
            f"Rewards at step {summary['steps']}:",
            "",
            "| agent@seat | reward | win rate |",
            "|---|---|---|",
        ]
        lines += [
            f"| {k} | {_fmt(v['reward'])} | {_fmt(v['win_rate'])} |"
            for k, v in sorted(summary["rewards"].items())
        ]
    return [*lines, ""]


def use_section(cfg: TeamConfig) -> list[str]:
    return [
        "## Use",
        "",
        "```python",
        "from marl.orchestrator import Team",
        "",
        'team = Team.load("path/to/this/folder")',
        'print(team.run("What is 2 + 3?").answer)',
        "graph = team.to_langgraph()  # a LangGraph node over MessagesState",
        "```",
        "",
        "OpenAI-compatible server: `marl serve path/to/this/folder --port 8000`, then any "
        "OpenAI client with `base_url=http://127.0.0.1:8000/v1` and "
        f"`model={cfg.name!r}`.",
        "",
    ]
