"""Complete graph vs chain vs learned topology on a cooperative task, with SmolLM2-135M.

The team: the task's holders (agents whose private views the task needs; the last one gives the
answer) plus ``--helpers`` agents who know nothing of their own and can only relay or confuse.
Every role runs the base model greedily (no adapter): the policies are frozen and only the
graph differs.  In one run:

1. topology-only training with the real trainer (``marl train``'s Trainer, ``train.policies``
   frozen, ``train.rollout`` team): ``--updates`` REINFORCE steps on utility = score -
   lambda x messages, ``--tasks-per-update`` tasks x ``--graphs-per-task`` sampled graphs each
   (the baseline is the mean of the same task's other graphs);
2. evaluation on ``--eval-tasks`` held-out tasks (seeds no training step uses) of the complete
   graph, a chain through the helpers, and the learned graph deployed at p > 0.5 (plus, for
   reference, "direct": the holders straight to the answerer, the helpers silent): accuracy
   with a 95% Wilson interval, messages and tokens per task, printed as ratios against the
   complete graph.

Goal (issue 6): the learned graph's accuracy inside the complete graph's interval with at most
half its messages.  ``OUT/run`` is an ordinary run folder (metrics.jsonl, a checkpoint with
topology.safetensors): ``marl plot``, ``marl topology show`` and ``marl export`` read it.

    .venv/bin/python scripts/bench/topology.py --out runs/bench_topology
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# this folder holds games.py (a benchmark): put the project first so `games` is the package
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from configs import TeamConfig, load_config_text  # noqa: E402
from games.tasks import make_task  # noqa: E402
from marl.topology import LearnedGraph  # noqa: E402
from marl.trainer import StepResult, Trainer  # noqa: E402
from orchestrator.credit import wilson  # noqa: E402
from orchestrator.team import Team, TeamResult  # noqa: E402
from topologies import SPATIAL, Topology  # noqa: E402

EVAL_SEED = 10**9  # held-out task seeds: EVAL_SEED + i (training seeds are hashes < 2**31)


#: task -> (holders in speaking order, the answerer last, with their system prompts; game kwargs)
TEAMS: dict[str, tuple[list[tuple[str, str]], str]] = {
    "split_arithmetic": ([
        ("agent_0", "You are agent_0. Tell your team the value you know, like: x1 = (your "
                    "value)."),
        ("agent_1", r"You are agent_1. Add x1 and x2. Write only the result as \boxed{{N}}."),
    ], "{n_agents: 2, difficulty: 0}"),
    "referential": ([
        ("sender_0", "You are the sender. Describe the target object in a few words (its "
                     "color and shape)."),
        ("receiver_0", "You are the receiver. Find the object that matches the description you "
                       r"received. Answer only with its number as \boxed{{N}}."),
    ], "{difficulty: 2}"),
}
HELPER = "You are {name}, a helper. You know nothing yourself: repeat briefly what you received."


def role(name: str, prompt: str, model: str, tokens: int, count: int = 1) -> str:
    return (f"  - name: {name}\n    count: {count}\n    model: {model}\n"
            f"    system_prompt: '{prompt}'\n"
            f"    decoding: {{mode: free, temperature: 0.0, max_new_tokens: {tokens}}}\n")


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


def chain(lt_agents: list[str]) -> list[tuple[str, str, str]]:
    """The holders' speaking order with every helper in between: a relay."""
    return [(a, b, SPATIAL) for a, b in zip(lt_agents, lt_agents[1:], strict=False)]


def evaluate(team: Team, topology: Topology, tasks: list) -> dict:
    t0 = time.perf_counter()
    results: list[TeamResult] = team.run_batch(tasks, topologies=topology)
    n = len(results)
    correct = sum(r.score or 0.0 for r in results)
    lo, hi = wilson(correct, n)
    return {"edges": [f"{s}->{d}" for s, d, _k in topology.edges], "accuracy": correct / n,
            "ci95": [lo, hi], "messages_per_task": sum(r.messages for r in results) / n,
            "tokens_per_task": sum(r.tokens for r in results) / n,
            "seconds": round(time.perf_counter() - t0, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--task", choices=sorted(TEAMS), default="split_arithmetic")
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
    args = ap.parse_args()

    out = Path(args.out)
    load_start = os.getloadavg()
    cfg: TeamConfig = load_config_text(team_yaml(args))
    t0 = time.perf_counter()
    trainer = Trainer(cfg, out / "run")
    graph = trainer.graph
    assert isinstance(graph, LearnedGraph)

    def show(res: StepResult) -> None:
        topo = res.metrics["topology"]
        print(f"update {res.step:3d}  score {topo['score']:.2f}  messages "
              f"{topo['messages_per_task']:.2f}  utility {topo['utility']:.3f}  p "
              + " ".join(f"{k}={v:.2f}" for k, v in topo["edge_probs"].items()), flush=True)

    trainer.fit(on_step=show)  # OUT/run: metrics.jsonl, a checkpoint `marl export` deploys
    train_s = time.perf_counter() - t0

    lt = graph.lt
    team = Team.from_config(cfg, policies=trainer.runtime.roster.policies)
    kwargs = cfg.game.kwargs
    tasks = [make_task(args.task, EVAL_SEED + i, **kwargs) for i in range(args.eval_tasks)]
    graphs = {"complete": Topology(lt.agents, lt.candidates, final=lt.final, strict=False),
              "chain": Topology(lt.agents, chain(lt.agents), final=lt.final, strict=False),
              "learned": lt.deploy(),
              # reference: each holder straight to the answerer, the helpers silent
              "direct": Topology(lt.agents, [(a, lt.final, SPATIAL) for a, _p in
                                             TEAMS[args.task][0][:-1]], final=lt.final,
                                 strict=False)}
    rows = {name: evaluate(team, g, tasks) for name, g in graphs.items()}
    full = rows["complete"]
    for r in rows.values():
        r["accuracy_ratio"] = r["accuracy"] / full["accuracy"] if full["accuracy"] else None
        r["messages_ratio"] = r["messages_per_task"] / full["messages_per_task"]
        r["tokens_ratio"] = r["tokens_per_task"] / full["tokens_per_task"]
    learned = rows["learned"]
    goal = (full["ci95"][0] <= learned["accuracy"] <= full["ci95"][1] or
            learned["accuracy"] >= full["accuracy"]) and learned["messages_ratio"] <= 0.5
    report = {"args": vars(args), "load_average": {"start": load_start,
                                                    "end": os.getloadavg()},
              "cpus": os.cpu_count(), "eval_seconds": round(time.perf_counter() - t0 - train_s, 1),
              "train_seconds": round(train_s, 1), "updates": trainer.step,
              "episodes_per_update": args.tasks_per_update * args.graphs_per_task,
              "edge_probs": {f"{s}->{d}": round(p, 3)
                             for (s, d, _k), p in lt.edge_probabilities().items()},
              "results": rows, "goal_met": goal}
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(report, indent=1))

    print(f"\n{args.task}, {args.eval_tasks} held-out tasks, team {', '.join(lt.agents)} "
          f"(answer: {lt.final}); learned after {trainer.step} updates x "
          f"{report['episodes_per_update']} episodes, lambda {args.cost_weight}/message, "
          f"{train_s / 60:.1f} min")
    print(f"{'graph':10s} {'accuracy':>9s} {'95% CI':>13s} {'acc/full':>9s} {'msgs':>5s} "
          f"{'msgs/full':>9s} {'tokens/full':>11s}  edges")
    for name, r in rows.items():
        ratio = "-" if r["accuracy_ratio"] is None else f"{r['accuracy_ratio']:.2f}"
        print(f"{name:10s} {r['accuracy']:9.3f} [{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}] "
              f"{ratio:>9s} {r['messages_per_task']:5.2f} {r['messages_ratio']:9.2f} "
              f"{r['tokens_ratio']:11.2f}  {', '.join(r['edges']) or '(none)'}")
    print(f"goal (learned accuracy within complete's CI or above, <= 50% of its messages): "
          f"{'met' if goal else 'not met'}; {os.cpu_count()} CPUs, load average (1 min) "
          f"{load_start[0]:.1f} at start, {os.getloadavg()[0]:.1f} at end")


if __name__ == "__main__":
    main()
