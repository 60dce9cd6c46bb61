"""The Dr. MAS effect: pooled (global) vs agent-wise advantage normalisation.

A cooperative game whose two agents see their shared reward on different scales
(``train.reward_scales``: player_1's reward x 0.1), each agent with its own LoRA adapter on one
base model.  For each seed and estimator we train and report

- the gradient-norm spike ratio: max / median of the per-step gradient norm, per agent and for
  the whole update (Dr. MAS: pooled statistics cause spikes),
- the final team reward (mean of the last quarter of steps, unscaled).

Ratios are printed against the global baseline measured in the same run.

    .venv/bin/python scripts/bench/drmas.py --model tiny-random --steps 40
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# this folder holds games.py (a benchmark): put the project first so `games` is the package
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from configs import load_config_text  # noqa: E402
from marl.trainer import Trainer  # noqa: E402

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


def run(model: str, game: str, estimator: str, seed: int, steps: int, lr: float) -> dict:
    cfg = load_config_text(TEAM.format(model=model, game=game, estimator=estimator,
                                       seed=seed, steps=steps, lr=lr))
    with tempfile.TemporaryDirectory() as tmp:
        hist = Trainer(cfg, Path(tmp)).fit()
    norms = [next(iter(h["learner"].values()))["grad_norm"] for h in hist if h["learner"]]
    per_agent: dict[str, list[float]] = {}
    for h in hist:
        for lr_stats in h["learner"].values():
            for k, v in lr_stats["agent_grad_norms"].items():
                per_agent.setdefault(k, []).append(v)
    tail = hist[-max(1, steps // 4):]
    team = statistics.mean(statistics.mean(a["reward"] for a in h["agents"].values())
                           for h in tail)

    def spike(xs: list[float]) -> float:
        xs = [x for x in xs if x > 0]
        return max(xs) / statistics.median(xs) if xs else float("nan")

    return {"spike": spike(norms), "agent_spikes": {k: spike(v) for k, v in per_agent.items()},
            "team_reward": team}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-random")
    ap.add_argument("--game", default="tiny_hanabi")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--lr", type=float, default=5e-3)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = ap.parse_args()
    console = Console()
    results: dict[str, list[dict]] = {"global": [], "agent_wise": []}
    for estimator in results:
        for seed in args.seeds:
            with console.status(f"{estimator} seed {seed}"):
                results[estimator].append(run(args.model, args.game, estimator, seed,
                                              args.steps, args.lr))
    table = Table(title=f"Dr. MAS on {args.game} ({args.model}, {args.steps} steps, "
                        "player_1 reward x0.1)")
    for col in ("estimator", "seed", "spike max/median", "per-agent spikes", "team reward"):
        table.add_column(col)
    for estimator, runs in results.items():
        for seed, r in zip(args.seeds, runs, strict=True):
            agents = ", ".join(f"{k.split('/')[-1]} {v:.1f}" for k, v in
                               sorted(r["agent_spikes"].items()))
            table.add_row(estimator, str(seed), f"{r['spike']:.2f}", agents,
                          f"{r['team_reward']:.2f}")
    console.print(table)
    def avg(runs: list[dict], key: str) -> float:
        return statistics.mean(r[key] for r in runs)

    g, a = results["global"], results["agent_wise"]
    console.print(f"agent_wise / global: spike ratio {avg(a, 'spike') / avg(g, 'spike'):.2f}x; "
                  f"team reward {avg(a, 'team_reward'):.2f} vs {avg(g, 'team_reward'):.2f}")

if __name__ == "__main__":
    main()
