"""Credit and specialisation report: which part of a trained team carries its accuracy.

On the same held-out tasks, :func:`credit_report` evaluates the trained team and its
ablations (:func:`ablations`):

- ``untrained``: every role's adapter fresh (LoRA starts as the identity: the base model);
- ``swap A<->B``: roles A and B trade trained adapters (every pair for up to three trainable
  roles, neighbours in role order beyond), each keeping its own prompt and private view: if
  the roles specialised, a swap hurts (PettingLLMs' test, by hand there);
- ``untrained A``: role A alone reverted to its fresh adapter, the others trained: the share
  of the gain A's training carries;
- ``drop S->D``: the trained team without one edge of its graph (a message never sent).

Every variant is a :class:`~marl.orchestrator.team.Team` built by ``Team.from_config`` with the
checkpoint's adapters, one at a time so only one copy of the base model is in memory.
Accuracy comes with a 95% Wilson interval and, for a team whose roles may defer, the share
of tasks handed to an expert; :meth:`CreditReport.write` writes a CSV, a JSON and a bar plot
with the intervals as error bars.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from marl.agents.builder import host_key
from marl.config import TeamConfig
from marl.games.tasks import Task, make_task, task_takes
from marl.orchestrator.team import Team, TeamResult
from marl.orchestrator.team.runtime import trained_parts
from marl.topologies import Topology, build_topology

#: First seed of held-out tasks: far from the small seeds tests and examples use (tasks with a
#: ``split`` argument are held out by content as well, whatever the seed).
EVAL_SEED = 1_000_000_000


def wilson(k: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a binomial proportion (sound at 0 and 1, unlike Wald)."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass(frozen=True)
class Accuracy:
    """A team's results on scored tasks: accuracy (an expert's answer counts for a deferred
    task), its interval, what the answers cost, and the share of tasks deferred."""

    n: int
    accuracy: float
    ci_low: float
    ci_high: float
    messages_per_task: float
    tokens_per_task: float
    deferral_rate: float = 0.0

    @classmethod
    def of(cls, results: Sequence[TeamResult]) -> Accuracy:
        n = len(results)
        correct = sum(r.score or 0.0 for r in results)
        lo, hi = wilson(correct, n)
        return cls(
            n,
            correct / n if n else 0.0,
            lo,
            hi,
            sum(r.messages for r in results) / max(n, 1),
            sum(r.tokens for r in results) / max(n, 1),
            sum(r.deferrals > 0 for r in results) / max(n, 1),
        )


def held_out_kwargs(task: str, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """``kwargs`` of ``task`` with its held-out split (``split="eval"``) when the task has
    one, so evaluation problems never coincide with training ones."""
    kwargs = dict(kwargs)
    if task_takes(task, "split"):
        kwargs["split"] = "eval"
    return kwargs


def held_out_tasks(
    task: str, kwargs: Mapping[str, Any], n: int, seed: int = EVAL_SEED
) -> list[Task]:
    """``n`` held-out instances of ``task``, on seeds ``seed, seed + 1, ...``."""
    kwargs = held_out_kwargs(task, kwargs)
    return [make_task(task, seed + i, **kwargs) for i in range(n)]


@dataclass(frozen=True)
class Variant:
    """One team to evaluate: the trained adapters each role loads, and the graph it runs."""

    name: str
    kind: str  # trained | untrained | swap | revert | drop
    adapters: Mapping[str, Path]
    topology: Topology


@dataclass(frozen=True)
class Trained:
    """A trained team's parts: its config, each trainable role's adapter folder, its graph."""

    cfg: TeamConfig
    adapters: Mapping[str, Path]
    topology: Topology

    @classmethod
    def load(cls, path: str | Path) -> Trained:
        """From a run (its latest checkpoint), a checkpoint or an exported team; the graph is
        the deployed learned one when the folder holds it, as ``Team.load`` runs it."""
        cfg, adapters, learned = trained_parts(path)
        topology = learned.deploy() if learned is not None else build_topology(cfg)
        return cls(cfg, adapters, topology)


def swap_pairs(cfg: TeamConfig, roles: Sequence[str]) -> list[tuple[str, str]]:
    """The role pairs whose adapters can trade places (same base model, same adapter shape):
    every pair of up to three roles, else each role with the next."""
    pairs = (
        itertools.combinations(roles, 2) if len(roles) <= 3 else zip(roles, roles[1:], strict=False)
    )

    def same(a: str, b: str) -> bool:
        ra, rb = cfg.role(a), cfg.role(b)
        return host_key(cfg, ra) == host_key(cfg, rb) and ra.adapter == rb.adapter

    return [(a, b) for a, b in pairs if same(a, b)]


def without_edge(topology: Topology, edge: tuple[str, str, str]) -> Topology:
    """``topology`` minus one edge; agents left with no path to the decision just never run."""
    return Topology(
        topology.agents,
        [e for e in topology.edges if e != edge],
        rounds=topology.rounds,
        final=topology.final,
        strict=False,
    )


def ablations(trained: Trained) -> list[Variant]:
    """The trained team first, then the untrained team, every swap, every reverted role and
    every dropped edge (see the module docstring)."""
    ad, topo = dict(trained.adapters), trained.topology
    out = [Variant("trained", "trained", ad, topo), Variant("untrained", "untrained", {}, topo)]
    for a, b in swap_pairs(trained.cfg, list(ad)):
        out.append(Variant(f"swap {a}<->{b}", "swap", {**ad, a: ad[b], b: ad[a]}, topo))
    for role in ad:
        out.append(
            Variant(f"untrained {role}", "revert", {r: p for r, p in ad.items() if r != role}, topo)
        )
    for edge in topo.edges:
        src, dst, kind = edge
        label = f"drop {src}->{dst}" + ("" if kind == "spatial" else f" ({kind})")
        out.append(Variant(label, "drop", ad, without_edge(topo, edge)))
    return out


def build_variant(cfg: TeamConfig, variant: Variant, *, seed: int = 0) -> Team:
    """The team of ``variant``: ``Team.from_config`` with its adapters and its graph."""
    return Team.from_config(cfg, seed=seed, adapters=variant.adapters, topology=variant.topology)


def accuracy_on(team: Team, problems: Sequence[Task], batch: int = 16) -> Accuracy:
    """``team``'s accuracy on ``problems``, answered ``batch`` at a time."""
    return Accuracy.of(
        [r for k in range(0, len(problems), batch) for r in team.run_batch(problems[k : k + batch])]
    )


@dataclass(frozen=True)
class CreditRow:
    name: str
    kind: str
    edges: int
    score: Accuracy

    def to_dict(self, trained: float) -> dict[str, Any]:
        return {
            "variant": self.name,
            "kind": self.kind,
            "edges": self.edges,
            **asdict(self.score),
            "delta": self.score.accuracy - trained,
        }


@dataclass
class CreditReport:
    team: str
    game: str
    task_kwargs: dict[str, Any]
    seed: int
    rows: list[CreditRow] = field(default_factory=list)

    @property
    def trained(self) -> float:
        return self.rows[0].score.accuracy if self.rows else 0.0

    def table(self) -> list[dict[str, Any]]:
        return [r.to_dict(self.trained) for r in self.rows]

    def to_dict(self) -> dict[str, Any]:
        return {
            "team": self.team,
            "game": self.game,
            "task_kwargs": self.task_kwargs,
            "seed": self.seed,
            "rows": self.table(),
        }

    def write(self, out: str | Path) -> dict[str, Path]:
        """``credit.csv``, ``credit.json`` and ``credit.png`` in ``out``."""
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        paths = {"csv": out / "credit.csv", "json": out / "credit.json", "png": out / "credit.png"}
        rows = self.table()
        with paths["csv"].open("w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        paths["json"].write_text(json.dumps(self.to_dict(), indent=1))
        plot_credit(self, paths["png"])
        return paths


def plot_credit(report: CreditReport, path: Path) -> None:
    """One bar per variant, its 95% interval as error bars, the trained accuracy dashed."""
    from matplotlib.figure import Figure

    rows = report.rows
    acc = [r.score.accuracy for r in rows]
    err = [
        [a - r.score.ci_low for a, r in zip(acc, rows, strict=True)],
        [r.score.ci_high - a for a, r in zip(acc, rows, strict=True)],
    ]
    colours = {
        "trained": "tab:green",
        "untrained": "0.6",
        "swap": "tab:red",
        "revert": "tab:orange",
        "drop": "tab:blue",
    }
    fig = Figure(figsize=(1.0 + 0.9 * len(rows), 4.2))
    ax = fig.add_subplot()
    ax.bar(range(len(rows)), acc, yerr=err, capsize=4, color=[colours[r.kind] for r in rows])
    ax.axhline(report.trained, color="0.3", lw=1, ls="--")
    ax.set_xticks(range(len(rows)), [r.name for r in rows], rotation=30, ha="right")
    ax.set_ylim(0, 1)
    ax.set_ylabel(f"accuracy on {rows[0].score.n} held-out tasks (95% Wilson)")
    ax.set_title(f"{report.team} on {report.game}: credit and specialisation")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def credit_report(
    path: str | Path,
    *,
    tasks: int = 60,
    seed: int = EVAL_SEED,
    temperature: float | None = 0.0,
    batch: int = 16,
    on_variant: Callable[[CreditRow], None] | None = None,
) -> CreditReport:
    """Evaluate the trained team at ``path`` and its :func:`ablations` on the same ``tasks``
    held-out tasks (``temperature`` 0: greedy, so rows differ only by the team)."""
    trained = Trained.load(path)
    cfg = trained.cfg.with_decoding(temperature=temperature)
    problems = held_out_tasks(cfg.game.name, cfg.game.kwargs, tasks, seed)
    report = CreditReport(
        cfg.name, cfg.game.name, held_out_kwargs(cfg.game.name, cfg.game.kwargs), seed
    )
    for variant in ablations(trained):
        team = build_variant(cfg, variant, seed=seed)
        row = CreditRow(
            variant.name,
            variant.kind,
            len(variant.topology.edges),
            accuracy_on(team, problems, batch),
        )
        report.rows.append(row)
        if on_variant is not None:
            on_variant(row)
        del team  # one base model in memory at a time
    return report
