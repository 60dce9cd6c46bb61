"""The Dr. MAS effect: pooled (global) vs agent-wise advantage normalisation.

Two workloads.  By default, a cooperative game whose two agents see their shared reward on
different scales (``train.reward_scales``: player_1's reward x 0.1), each agent with its own
LoRA adapter on one base model.  With ``--team FILE``, a team recipe on a team task, trained as
the recipe says but with ``--scale AGENT=X`` reward multipliers (the same heterogeneity on a
real team) and, with ``--reward individual``, per-role rewards where the task scores roles.
For each seed and estimator we train and report

- the gradient-norm spike ratio: max / median of the per-step gradient norm, per agent and for
  the whole update (Dr. MAS: pooled statistics cause spikes),
- the final team reward (mean of the last quarter of steps; with ``--team`` the task score,
  unscaled) and with ``--team`` the held-out accuracy of the trained team (greedy, 95%
  interval).

Ratios are printed against the global baseline measured in the same run.

    .venv/bin/python -m scripts.experiments.drmas --model tiny-random --steps 40
    .venv/bin/python -m scripts.experiments.drmas --team configs/coop_plan_execute.yaml --steps 20 \
        --seeds 0 --scale planner=0.1 --out runs/drmas
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from contextlib import nullcontext
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from marl.config import TeamConfig, load_config, load_config_text  # noqa: E402
from marl.orchestrator.arena.credit import (  # noqa: E402
    Trained,
    ablations,
    accuracy_on,
    build_variant,
    held_out_tasks,
)
from marl.train.trainer import Trainer  # noqa: E402
from scripts.workloads import train_here  # noqa: E402

TEAM = """\
schema: marl-teams/v1
name: drmas-{estimator}
roles:
  - name: first
    model: {model}
    adapter: {{r: 8, alpha: 16}}
    decoding: {{mode: choice}}
  - name: second
    model: {model}
    share_base_with: first
    adapter: {{r: 8, alpha: 16}}
    decoding: {{mode: choice}}
game: {{name: {game}}}
train:
  steps: {steps}
  advantage: {estimator}
  reward: team
  reward_scales: {{player_1: 0.1}}
  group_size: 8
  groups_per_step: 8
  lr: {lr}
  seed: {seed}
  checkpoint_every: 1000
  ray: {{enabled: false}}
"""


def tiny_config(
    model: str, game: str, estimator: str, seed: int, steps: int, lr: float
) -> TeamConfig:
    return load_config_text(
        TEAM.format(model=model, game=game, estimator=estimator, seed=seed, steps=steps, lr=lr)
    )


def team_config(
    path: str, estimator: str, seed: int, steps: int, scales: dict[str, float], reward: str | None
) -> TeamConfig:
    """The team's recipe with this estimator, seed, reward scales (and reward), ``steps``
    steps, in this process."""
    cfg = load_config(path)
    assert cfg.train is not None, f"{path} has no train section"
    return cfg.replace(
        train=train_here(
            cfg.train,
            steps,
            advantage=estimator,
            reward=reward or cfg.train.reward,
            reward_scales=scales,
            seed=seed,
        )
    )


def run(cfg: TeamConfig, folder: Path, eval_tasks: int) -> dict:
    hist = Trainer(cfg, folder).fit()
    norms = [next(iter(h["learner"].values()))["grad_norm"] for h in hist if h["learner"]]
    per_agent: dict[str, list[float]] = {}
    for h in hist:
        for lr_stats in h["learner"].values():
            for k, v in lr_stats["agent_grad_norms"].items():
                per_agent.setdefault(k, []).append(v)
    tail = hist[-max(1, len(hist) // 4) :]
    team = statistics.mean(
        h["topology"]["score"]
        if h.get("topology")
        # a team task's
        else statistics.mean(a["reward"] for a in h["agents"].values())
        for h in tail
    )

    def spike(xs: list[float]) -> float:
        xs = [x for x in xs if x > 0]
        return max(xs) / statistics.median(xs) if xs else float("nan")

    out = {
        "spike": spike(norms),
        "agent_spikes": {k: spike(v) for k, v in per_agent.items()},
        "team_reward": team,
        "accuracy": None,
    }
    if eval_tasks:
        trained = Trained.load(folder)
        cfg = trained.cfg.with_decoding(temperature=0.0)
        problems = held_out_tasks(cfg.game.name, cfg.game.kwargs, eval_tasks)
        out["accuracy"] = accuracy_on(build_variant(cfg, ablations(trained)[0]), problems)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-random")
    ap.add_argument("--game", default="tiny_hanabi")
    ap.add_argument("--team", help="a team recipe on a team task")
    ap.add_argument(
        "--scale",
        action="append",
        default=[],
        metavar="AGENT=X",
        help="--team: multiply AGENT's reward by X (repeatable)",
    )
    ap.add_argument(
        "--reward",
        choices=["team", "individual"],
        help="--team: override the recipe's train.reward",
    )
    ap.add_argument("--out", help="keep the runs in OUT/ESTIMATOR-sSEED (default: temporary)")
    ap.add_argument("--eval-tasks", type=int, default=60, help="--team: held-out tasks")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--lr", type=float, default=5e-3)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = ap.parse_args()
    console = Console()
    scales = {k: float(v) for k, v in (kv.split("=", 1) for kv in args.scale)}
    results: dict[str, list[dict]] = {"global": [], "agent_wise": []}
    for estimator in results:
        for seed in args.seeds:
            cfg = (
                team_config(args.team, estimator, seed, args.steps, scales, args.reward)
                if args.team
                else tiny_config(args.model, args.game, estimator, seed, args.steps, args.lr)
            )
            kept = Path(args.out) / f"{estimator}-s{seed}" if args.out else None
            with (
                nullcontext(kept) if kept else tempfile.TemporaryDirectory() as folder,
                console.status(f"{estimator} seed {seed}"),
            ):
                results[estimator].append(
                    run(cfg, Path(folder), args.eval_tasks if args.team else 0)
                )
    what = (
        f"{args.team}, reward x {scales or 1}"
        if args.team
        else f"{args.game} ({args.model}), player_1 reward x0.1"
    )
    table = Table(title=f"Dr. MAS on {what}, {args.steps} steps")
    cols = [
        "estimator",
        "seed",
        "spike max/median",
        "per-agent spikes",
        "team score" if args.team else "team reward",
    ]
    for col in cols + (["held-out accuracy [95% CI]"] if args.team else []):
        table.add_column(col)
    for estimator, runs in results.items():
        for seed, r in zip(args.seeds, runs, strict=True):
            agents = ", ".join(
                f"{k.split('/')[-1]} {v:.1f}" for k, v in sorted(r["agent_spikes"].items())
            )
            row = [estimator, str(seed), f"{r['spike']:.2f}", agents, f"{r['team_reward']:.2f}"]
            acc = r["accuracy"]
            if acc is not None:
                row.append(f"{acc.accuracy:.3f} [{acc.ci_low:.3f}, {acc.ci_high:.3f}]")
            table.add_row(*row)
    console.print(table)

    def avg(runs: list[dict], key: str) -> float:
        return statistics.mean(r[key] for r in runs)

    g, a = results["global"], results["agent_wise"]
    console.print(
        f"agent_wise / global: spike ratio {avg(a, 'spike') / avg(g, 'spike'):.2f}x; "
        f"reward {avg(a, 'team_reward'):.2f} vs {avg(g, 'team_reward'):.2f}"
    )


if __name__ == "__main__":
    main()
