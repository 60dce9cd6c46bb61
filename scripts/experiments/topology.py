"""Complete graph vs chain vs learned topology on a cooperative task, with SmolLM2-135M.

The team: the task's holders (agents whose private views the task needs; the last one gives the
answer) plus ``--helpers`` agents who know nothing of their own and can only relay or confuse.
By default every role runs the base model greedily (no adapter): the policies are frozen and
only the graph differs.  With ``--team FILE`` the holders are that recipe's roles instead
(``--init RUN``: their adapters start from RUN's trained ones), and ``--train-policies`` trains
those adapters together with the graph, one joint step per update.  In one run:

1. training with the real trainer (``marl train``'s Trainer, ``train.rollout`` team):
   ``--updates`` REINFORCE steps on utility = score - lambda x messages, ``--tasks-per-update``
   tasks x ``--graphs-per-task`` sampled graphs each (the baseline is the mean of the same
   task's other graphs), and with ``--train-policies`` a GRPO step of the adapters on the same
   episodes;
2. evaluation on ``--eval-tasks`` held-out tasks (seeds no training step uses, the held-out
   split where the task has one) of the complete graph, a chain through the helpers, and the
   learned graph deployed at p > 0.5 (plus, for reference, "direct": the holders straight to
   the answerer, the helpers silent), every role greedy with the run's final adapters:
   accuracy with a 95% Wilson interval, messages and tokens per task, printed as ratios
   against the complete graph.

Goal: the learned graph's accuracy inside the complete graph's interval (or above) with at most
half its messages.  ``OUT/run`` is an ordinary run folder (metrics.jsonl, a checkpoint with
topology.safetensors): ``marl plot``, ``marl topology show`` and ``marl export`` read it.

    .venv/bin/python -m scripts.experiments.topology --out runs/bench_topology
    .venv/bin/python -m scripts.experiments.topology --team configs/coop_plan_execute.yaml \
        --init runs/coop --train-policies --out runs/bench_topology_coop
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from marl.config import TeamConfig, load_config, load_config_text  # noqa: E402
from marl.config.schema import DecodingConfig, RoleConfig, TopologyConfig  # noqa: E402
from marl.orchestrator.arena.credit import Accuracy, held_out_tasks  # noqa: E402
from marl.orchestrator.team import Team  # noqa: E402
from marl.orchestrator.team.runtime import trained_parts  # noqa: E402
from marl.topologies import SPATIAL, LearnableTopology, Topology  # noqa: E402
from marl.train.topology import LearnedGraph  # noqa: E402
from marl.train.trainer import StepResult, Trainer  # noqa: E402
from scripts.workloads import train_here  # noqa: E402

#: task -> (holders in speaking order, the answerer last, with their system prompts; game kwargs)
TEAMS: dict[str, tuple[list[tuple[str, str]], str]] = {
    "split_arithmetic": (
        [
            (
                "agent_0",
                "You are agent_0. Tell your team the value you know, like: x1 = (your value).",
            ),
            ("agent_1", r"You are agent_1. Add x1 and x2. Write only the result as \boxed{{N}}."),
        ],
        "{n_agents: 2, difficulty: 0}",
    ),
    "referential": (
        [
            (
                "sender_0",
                "You are the sender. Describe the target object in a few words (its "
                "color and shape).",
            ),
            (
                "receiver_0",
                "You are the receiver. Find the object that matches the description you "
                r"received. Answer only with its number as \boxed{{N}}.",
            ),
        ],
        "{difficulty: 2}",
    ),
}
HELPER = "You are {name}, a helper. You know nothing yourself: repeat briefly what you received."


def role(name: str, prompt: str, model: str, tokens: int, count: int = 1) -> str:
    return (
        f"  - name: {name}\n    count: {count}\n    model: {model}\n"
        f"    system_prompt: '{prompt}'\n"
        f"    decoding: {{mode: free, temperature: 0.0, max_new_tokens: {tokens}}}\n"
    )


def team_yaml(args: argparse.Namespace) -> str:
    """The team file: the first holder(s), the helpers, the answerer; frozen, learnable."""
    holders, kwargs = TEAMS[args.task]
    roles = [role(n, p, args.model, args.max_new_tokens) for n, p in holders]
    if args.helpers:
        roles.insert(-1, role("helper", HELPER, args.model, args.max_new_tokens, args.helpers))
    final = holders[-1][0]
    return f"""\
schema: marl-teams/v1
name: bench-topology
roles:
{"".join(roles)}topology:
  kind: complete
  learnable: true
  final: {final}
  learning: {{lr: {args.lr}, cost: messages, cost_weight: {args.cost_weight}, baseline: loo}}
game: {{name: {args.task}, kwargs: {kwargs}}}
train:
  rollout: team
  policies: frozen
  steps: {args.updates}
  group_size: {args.graphs_per_task}
  groups_per_step: {args.tasks_per_update}
  seed: {args.seed}
  checkpoint_every: 1000
  ray: {{enabled: false}}
"""


def recipe_team(args: argparse.Namespace) -> TeamConfig:
    """``--team``'s roles (adapters from ``--init``) with the helpers before its final role,
    on a learnable complete graph; its train section with this run's sizes."""
    cfg = load_config(args.team)
    assert cfg.train is not None and cfg.topology.final is not None, (
        f"{args.team}: a recipe with a train section and a final role"
    )
    init = trained_parts(args.init)[1] if args.init else {}
    roles = [
        r.replace(adapter=r.adapter.replace(init=str(init[r.name])))
        if r.adapter is not None and r.name in init
        else r
        for r in cfg.roles
    ]
    if args.helpers:
        final = next(i for i, r in enumerate(roles) if r.name == cfg.topology.final)
        roles.insert(
            final,
            RoleConfig(
                name="helper",
                count=args.helpers,
                model=roles[0].model,
                system_prompt=HELPER,
                decoding=DecodingConfig(
                    mode="free",
                    temperature=0.0,
                    max_new_tokens=args.max_new_tokens,
                    precision=roles[0].decoding.precision,
                ),
            ),
        )
    return cfg.replace(
        roles=roles,
        topology=TopologyConfig(
            kind="complete",
            learnable=True,
            final=cfg.topology.final,
            learning={
                "lr": args.lr,
                "cost": "messages",
                "cost_weight": args.cost_weight,
                "baseline": "loo",
            },
        ),
        train=train_here(
            cfg.train,
            args.updates,
            rollout="team",
            policies="train" if args.train_policies else "frozen",
            group_size=args.graphs_per_task,
            groups_per_step=args.tasks_per_update,
            seed=args.seed,
            checkpoint_every=1000,
        ),
    )


def chain(lt_agents: list[str]) -> list[tuple[str, str, str]]:
    """The holders' speaking order with every helper in between: a relay."""
    return [(a, b, SPATIAL) for a, b in zip(lt_agents, lt_agents[1:], strict=False)]


def evaluate(team: Team, topology: Topology, tasks: list) -> dict:
    t0 = time.perf_counter()
    acc = Accuracy.of(team.run_batch(tasks, topologies=topology))
    return {
        "edges": [f"{s}->{d}" for s, d, _k in topology.edges],
        "accuracy": acc.accuracy,
        "ci95": [acc.ci_low, acc.ci_high],
        "messages_per_task": acc.messages_per_task,
        "tokens_per_task": acc.tokens_per_task,
        "seconds": round(time.perf_counter() - t0, 1),
    }


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--task", choices=sorted(TEAMS), default="split_arithmetic")
    ap.add_argument("--team", help="a recipe YAML on a team task: its roles are the holders")
    ap.add_argument("--init", help="--team: a run whose trained adapters the roles start from")
    ap.add_argument(
        "--train-policies",
        action="store_true",
        help="--team: train the adapters with the graph (else frozen)",
    )
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--helpers", type=int, default=1)
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--updates", type=int, default=16)
    ap.add_argument("--tasks-per-update", type=int, default=4)
    ap.add_argument("--graphs-per-task", type=int, default=4)
    ap.add_argument("--cost-weight", type=float, default=0.1, help="lambda per message")
    ap.add_argument("--lr", type=float, default=0.5, help="Adam step size on the logits")
    ap.add_argument("--eval-tasks", type=int, default=60)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="runs/bench_topology")
    return ap.parse_args()


def show(res: StepResult) -> None:
    topo = res.metrics["topology"]
    print(
        f"update {res.step:3d}  score {topo['score']:.2f}  messages "
        f"{topo['messages_per_task']:.2f}  utility {topo['utility']:.3f}  p "
        + " ".join(f"{k}={v:.2f}" for k, v in topo["edge_probs"].items()),
        flush=True,
    )


def train(cfg: TeamConfig, run: Path) -> tuple[LearnableTopology, int]:
    """The graph (and with ``--train-policies`` the adapters) trained into ``run``, an ordinary
    run folder (metrics.jsonl, a checkpoint ``marl export`` deploys); the learned graph's
    edges and the number of updates."""
    trainer = Trainer(cfg, run)
    graph = trainer.graph
    assert isinstance(graph, LearnedGraph)
    trainer.fit(on_step=show)
    return graph.lt, trainer.step


def compare(team: Team, lt: LearnableTopology, tasks: list) -> dict[str, dict]:
    """Each graph's held-out figures, with its ratios to the complete graph's."""
    holders = [a for a in lt.agents if not a.startswith("helper")]  # the answerer last
    graphs = {
        "complete": Topology(lt.agents, lt.candidates, final=lt.final, strict=False),
        "chain": Topology(lt.agents, chain(lt.agents), final=lt.final, strict=False),
        "learned": lt.deploy(),
        # reference: each holder straight to the answerer, the helpers silent
        "direct": Topology(
            lt.agents, [(a, lt.final, SPATIAL) for a in holders[:-1]], final=lt.final, strict=False
        ),
    }
    rows = {name: evaluate(team, g, tasks) for name, g in graphs.items()}
    full = rows["complete"]
    for r in rows.values():
        r["accuracy_ratio"] = r["accuracy"] / full["accuracy"] if full["accuracy"] else None
        r["messages_ratio"] = r["messages_per_task"] / full["messages_per_task"]
        r["tokens_ratio"] = r["tokens_per_task"] / full["tokens_per_task"]
    return rows


def print_table(rows: dict[str, dict]) -> None:
    print(
        f"{'graph':10s} {'accuracy':>9s} {'95% CI':>13s} {'acc/full':>9s} {'msgs':>5s} "
        f"{'msgs/full':>9s} {'tokens/full':>11s}  edges"
    )
    for name, r in rows.items():
        ratio = "-" if r["accuracy_ratio"] is None else f"{r['accuracy_ratio']:.2f}"
        print(
            f"{name:10s} {r['accuracy']:9.3f} [{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}] "
            f"{ratio:>9s} {r['messages_per_task']:5.2f} {r['messages_ratio']:9.2f} "
            f"{r['tokens_ratio']:11.2f}  {', '.join(r['edges']) or '(none)'}"
        )


def main() -> None:
    args = parse_args()
    out = Path(args.out)
    load_start = os.getloadavg()
    cfg: TeamConfig = recipe_team(args) if args.team else load_config_text(team_yaml(args))
    t0 = time.perf_counter()
    lt, updates = train(cfg, out / "run")  # the trainer's model hosts are gone after it
    train_s = time.perf_counter() - t0
    team = Team.from_config(
        cfg.with_decoding(temperature=0.0), adapters=trained_parts(out / "run")[1]
    )
    tasks = held_out_tasks(cfg.game.name, cfg.game.kwargs, args.eval_tasks)
    rows = compare(team, lt, tasks)
    full, learned = rows["complete"], rows["learned"]
    goal = (
        full["ci95"][0] <= learned["accuracy"] <= full["ci95"][1]
        or learned["accuracy"] >= full["accuracy"]
    ) and learned["messages_ratio"] <= 0.5
    report = {
        "args": vars(args),
        "load_average": {"start": load_start, "end": os.getloadavg()},
        "cpus": os.cpu_count(),
        "eval_seconds": round(time.perf_counter() - t0 - train_s, 1),
        "train_seconds": round(train_s, 1),
        "updates": updates,
        "episodes_per_update": args.tasks_per_update * args.graphs_per_task,
        "edge_probs": {
            f"{s}->{d}": round(p, 3) for (s, d, _k), p in lt.edge_probabilities().items()
        },
        "results": rows,
        "goal_met": goal,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(report, indent=1))

    print(
        f"\n{cfg.game.name}, {args.eval_tasks} held-out tasks, team {', '.join(lt.agents)} "
        f"(answer: {lt.final}); learned after {updates} updates x "
        f"{report['episodes_per_update']} episodes, lambda {args.cost_weight}/message, "
        f"{train_s / 60:.1f} min"
    )
    print_table(rows)
    print(
        f"goal (learned accuracy within complete's CI or above, <= 50% of its messages): "
        f"{'met' if goal else 'not met'}; {os.cpu_count()} CPUs, load average (1 min) "
        f"{load_start[0]:.1f} at start, {os.getloadavg()[0]:.1f} at end"
    )


if __name__ == "__main__":
    main()
