"""Think targets on a tabular replica: how many reasonings a state a step's reads need.

``configs/kuhn_think_target.yaml`` reads each information state's mixture over reasonings from
4 sampled reasonings, and both the step's action values and its fit depend on that read, so
the last iterate of a 45-minute SmolLM2 run swings by 0.05-0.1 from step to step.  This replica
runs the recipe's step on a table, with the reasoning as noise on the move's logit, to compare
ways of spending a step's time on reads before spending 45 minutes of SmolLM2 on one.

The policy at information state s after reasoning z moves with probability

    pi(a_1 | s, z) = sigmoid(theta_s + sigma * eps_z),    eps_z ~ N(0, 1)

(Kuhn has two moves at every state), so the policy at s is the mixture
E_eps sigmoid(theta_s + sigma eps), computed exactly by Gauss-Hermite quadrature for the
exploitability reported.  A step, as the trainer's (``train.rollout: states``,
``think_fit: pooled``):

1. reads: ``reads`` reasonings at every state, the table their mixtures show, the action values
   Q(s, .) exact on the game tree under it (``marl.train.states``);
2. pools: the states of one point of play (the three cards) all scored after the same ``fit``
   reasonings drawn from the pool's reads (``pool_reasonings``); the target is MMD's closed form
   (``mmd_target``) from the mixture and the magnet's over those reasonings and Q;
3. fit: theta_s moved ``reach`` of the way to where the mixture over the drawn reasonings equals
   the target (the Gauss-Newton step along the mean logit difference moves every reasoning's
   logit alike; SmolLM2's fit lowers the KL to a third to a half, ``reach`` 0.5 or so);
4. the magnet moves ``mix`` of the way to the policy (in logits) every ``every`` steps.

A variant's steps are its budget: the figures of a step's cost come from the SmolLM2 recipe
(docs/lab/kuhn-text.md), so every row of a table is 45 minutes of that machine.

    .venv/bin/python -m scripts.experiments.kuhn_think_reads --seeds 20
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from marl.games.analysis import exploitability, info_states, state_action_values
from marl.train.objectives.policy_target import mmd_target

GAME = "kuhn_poker"
NODES, WEIGHTS = np.polynomial.hermite_e.hermegauss(40)  # for E over N(0, 1)
WEIGHTS = WEIGHTS / WEIGHTS.sum()


@dataclass(frozen=True)
class Variant:
    name: str
    steps: int  # what 45 minutes buy at this variant's step time
    reads: int = 4  # reasonings read at every state (train.group_size)
    fit: int = 4  # reasonings each state is fitted after (drawn from its pool's reads)


# step times from the SmolLM2 recipe at e6515a1 (one Gauss-Newton step a fit, every length
# searched) on AMD EPYC, AVX2, fp32: a 4-read step ~158 s (rollout 30, update 128), 8 reads
# fitted after 8 ~250 s; sampling 4 more reasonings a state ~+26 s
VARIANTS = [
    Variant("4 reads, fitted after 4 (the recipe)", 17),
    Variant("8 reads, fitted after 8 (group_size 8)", 11, 8, 8),
    Variant("8 reads, fitted after 4", 15, 8, 4),
    Variant("16 reads, fitted after 4", 12, 16, 4),
]


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


def table(p1: np.ndarray, states: list) -> dict:
    """The policy table with ``p1[i]`` on the second move at the i-th information state."""
    rows = zip(states, p1, strict=True)
    return {k: dict(zip(legal, (1 - p, p), strict=True)) for (k, _, legal), p in rows}


def solve(eps: np.ndarray, sigma: float, want: float, start: float) -> float:
    """theta with mean_j sigmoid(theta + sigma eps_j) = want (Newton's method, monotone)."""
    theta = start
    for _ in range(50):
        p = sigmoid(theta + sigma * eps)
        gap, slope = p.mean() - want, (p * (1 - p)).mean()
        theta -= float(np.clip(gap / max(slope, 1e-9), -5, 5))
        if abs(gap) < 1e-10:
            break
    return theta


def run(v: Variant, seed: int, args) -> list[float]:
    """The exact exploitability of the mixture after every step."""
    rng = np.random.default_rng(seed)
    states = info_states(GAME)
    pools: dict[str, list[int]] = {}
    for i, (k, _, _) in enumerate(states):
        pools.setdefault(k.split(":", 1)[1] if ":" in k else "", []).append(i)
    theta = 0.3 * rng.standard_normal(len(states))
    magnet, curve = theta.copy(), []
    for step in range(1, v.steps + 1):
        eps = rng.standard_normal((len(states), v.reads))
        read = sigmoid(theta[:, None] + args.sigma * eps).mean(1)
        q = state_action_values(GAME, table(read, states))
        drawn = np.empty((len(states), v.fit))
        for members in pools.values():
            shared = rng.permutation(eps[members].ravel())[: v.fit]
            drawn[members] = shared
        mix = sigmoid(theta[:, None] + args.sigma * drawn).mean(1)
        rho = sigmoid(magnet[:, None] + args.sigma * drawn).mean(1)
        logp = torch.log(torch.tensor(np.stack([1 - mix, mix], 1)))
        log_rho = torch.log(torch.tensor(np.stack([1 - rho, rho], 1)))
        qs = torch.tensor([[q[k][a] for a in legal] for k, _, legal in states])
        want = mmd_target(logp, log_rho, qs, args.eta, args.alpha)[:, 1].exp().numpy()
        for s in range(len(states)):
            best = solve(drawn[s], args.sigma, float(want[s]), theta[s])
            theta[s] += args.reach * (best - theta[s])
        if step % args.every == 0:
            magnet = (1 - args.mix) * magnet + args.mix * theta
        true = sigmoid(theta[:, None] + args.sigma * NODES[None]) @ WEIGHTS
        curve.append(exploitability(GAME, table(true, states)))
    return curve


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--sigma", type=float, nargs="+", default=[0.5, 1.0, 2.0])
    ap.add_argument("--reach", type=float, nargs="+", default=[1.0, 0.5])
    ap.add_argument("--eta", type=float, default=3.0)
    ap.add_argument("--alpha", type=float, default=0.5)
    ap.add_argument("--every", type=int, default=2)
    ap.add_argument("--mix", type=float, default=0.5)
    args = ap.parse_args()
    console = Console()
    out = Table(
        title=f"Think targets, tabular replica: exact exploitability of the last iterate "
        f"({args.seeds} seeds; eta {args.eta}, alpha {args.alpha}, magnet every {args.every} "
        f"steps, mix {args.mix})"
    )
    for col in ("sigma", "reach", "variant", "steps", "final mean", "final worst", "<= 0.10"):
        out.add_column(col, justify="left" if col == "variant" else "right")
    for sigma in args.sigma:
        for reach in args.reach:
            for v in VARIANTS:
                ns = argparse.Namespace(**{**vars(args), "sigma": sigma, "reach": reach})
                final = np.array([run(v, seed, ns)[-1] for seed in range(args.seeds)])
                row = (
                    f"{sigma}",
                    f"{reach}",
                    v.name,
                    f"{v.steps}",
                    f"{final.mean():.3f}",
                    f"{final.max():.3f}",
                    f"{int((final <= 0.10).sum())}/{args.seeds}",
                )
                out.add_row(*row)
                console.print(" | ".join(row), highlight=False)
    console.print(out)


if __name__ == "__main__":
    main()
