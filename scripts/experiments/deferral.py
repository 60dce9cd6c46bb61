"""Benchmark deferral to an expert: how often a trained role defers, by the cost of deferring.

The same team is trained from scratch at each cost c in ``--costs`` (default 0, 0.2, 0.5, 1,
1.5) for ``--steps`` steps, its ``--role`` allowed to defer to the oracle (the task's reference
answer, the stand-in for a human expert) at cost c, and told so in its goal.  docs/algorithms.md
(deferring to an expert) predicts deferral where P(own answer right) < 1 - c: always at c = 0,
never once c >= 1.  The table gives per cost the deferral rate of training's last fifth of
steps, then the trained team's held-out accuracy (greedy, expert answers included) with its 95%
Wilson interval, and the expert calls per held-out task.

    .venv/bin/python -m scripts.experiments.deferral --steps 60      # SmolLM2 plan/execute
    .venv/bin/python -m scripts.experiments.deferral --model tiny-random --steps 1 --tasks 4
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import argparse  # noqa: E402
import tempfile  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

warnings.filterwarnings("ignore")

from marl.config import TeamConfig, load_config  # noqa: E402
from marl.config.schema import DeferConfig  # noqa: E402
from marl.orchestrator.arena.credit import Accuracy, held_out_tasks  # noqa: E402
from marl.orchestrator.team import Team  # noqa: E402
from marl.orchestrator.team.runtime import trained_parts  # noqa: E402
from marl.train.trainer import Trainer  # noqa: E402
from scripts.workloads import CONFIGS, train_here  # noqa: E402

COSTS = (0.0, 0.2, 0.5, 1.0, 1.5)


def deferring(
    cfg: TeamConfig, role: str, cost: float, token: str, steps: int, model: str | None
) -> TeamConfig:
    """``cfg`` with ``role`` deferring to the oracle at ``cost`` (and told how), trained for
    ``steps`` steps in this process."""
    roles = []
    for r in cfg.roles:
        if model is not None and r.backend in ("hf", "vllm"):
            r = r.replace(model=model, decoding=r.decoding.replace(precision="fp32"))
        if r.name == role:
            r = r.replace(
                defer=DeferConfig(expert="oracle", cost=cost, token=token),
                goal=f"{r.goal} If you cannot do it, write only {token}: an expert "
                f"then answers for the team, which costs it {cost:g}.",
            )
        roles.append(r)
    train = train_here(
        cfg.train,
        steps,
        checkpoint_every=steps,
        precision="fp32" if model is not None else cfg.train.precision,
    )
    return cfg.replace(roles=roles, train=train)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", type=Path, default=CONFIGS / "coop_plan_execute.yaml")
    ap.add_argument("--role", default="planner", help="the role that may defer")
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--costs", type=float, nargs="+", default=COSTS)
    ap.add_argument("--token", default="DEFER")
    ap.add_argument("--tasks", type=int, default=200, help="held-out tasks per cost")
    ap.add_argument(
        "--model",
        default=None,
        help="replace every local role's model (and run in fp32), e.g. tiny-random",
    )
    ap.add_argument("--out", type=Path, default=None, help="keep the runs here")
    args = ap.parse_args()
    base = load_config(args.config)
    out = args.out or Path(tempfile.mkdtemp(prefix="deferral-"))
    print(
        f"{base.name} on {base.game.name}: {args.role} defers to the oracle; {args.steps} "
        f"steps per cost, {args.tasks} held-out tasks; runs in {out}"
    )
    print(
        f"{'cost':>5} | {'deferral rate (train)':>21} | {'held-out accuracy [95% CI]':>27} | "
        f"{'expert calls/task':>17}"
    )
    for cost in args.costs:
        cfg = deferring(base, args.role, cost, args.token, args.steps, args.model)
        run = out / f"cost_{cost:g}"
        history = Trainer(cfg, run).fit()
        tail = history[-max(1, len(history) // 5) :]
        rate = sum(h["deferral_rate"] for h in tail) / len(tail)
        trained, adapters, learned = trained_parts(run)
        team = Team.from_config(
            trained.with_decoding(temperature=0.0), adapters=adapters, learnable=learned
        )
        tasks = held_out_tasks(cfg.game.name, cfg.game.kwargs, args.tasks)
        results = [r for k in range(0, len(tasks), 16) for r in team.run_batch(tasks[k : k + 16])]
        acc = Accuracy.of(results)
        calls = sum(r.expert is not None for r in results) / max(len(results), 1)
        print(
            f"{cost:>5g} | {rate:>21.3f} | {acc.accuracy:>8.3f} [{acc.ci_low:.3f}, "
            f"{acc.ci_high:.3f}]{'':>5} | {calls:>17.3f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
