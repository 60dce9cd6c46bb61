"""Kuhn self-play by MMD's closed-form step on a table, from a peaked start: which magnet moves it.

The free-text recipe (``configs/kuhn_freetext_target.yaml``) starts from SmolLM2's untrained
answers, ``[Check]`` about 5 nats above ``[Bet]`` and ``[Call]`` about 2 above ``[Fold]``, and
its last iterate stalls near 0.16 with no card ever betting.  This replica takes the recipe's
step exactly, with nothing sampled and nothing fitted: per information state a logit per legal
move; each step the action values of the current table on the game tree (``Q(s, a)`` in chips,
what the recipe's reads give once exact), the target of
:func:`marl.train.objectives.policy_target.mmd_target`, and the table set to it; every
``every`` steps the magnet's logits mixed towards the table's by ``mix`` (the recipe mixes its
adapter's weights).  What it asks is how the magnet's start and reading change the last iterate:

- ``copy``: the recipe's magnet, a copy of the starting (peaked) table;
- ``uniform``: the magnet starts uniform (MMD's own magnet), then follows the table;
- a temperature T: the magnet's distribution read at T (its logits / T), a flatter pull
  towards the same moves.

    .venv/bin/python -m scripts.experiments.kuhn_mmd_start [--steps 60] [--json]

Figures are exact exploitability of the table after each step.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Literal

import torch

from marl.games.analysis import exploitability, info_states, state_action_values
from marl.train.objectives.policy_target import mmd_target

GAME = "kuhn_poker"
CHECK, BET, CALL, FOLD = range(4)
#: The untrained SmolLM2 answers' log-probability gaps (docs/lab/kuhn-text.md).
PEAKED = {CHECK: 5.2, CALL: 1.8}
LEGAL = {key: acts for key, _, acts in info_states(GAME)}


@dataclass(frozen=True)
class Variant:
    name: str
    magnet: Literal["copy", "uniform"] = "copy"
    temperature: float = 1.0  # the magnet's distribution read at this temperature
    eta: float = 5.0
    alpha: float = 0.5
    every: int = 2
    mix: float = 0.5


VARIANTS = [
    Variant("the recipe: magnet a copy of the start"),
    Variant("magnet uniform at the start", magnet="uniform"),
    Variant("magnet read at T 3", temperature=3.0),
    Variant("magnet uniform at the start, alpha 0.2", magnet="uniform", alpha=0.2),
]


def peaked_start() -> dict[str, torch.Tensor]:
    """Per information state, logits with the untrained answers' gaps."""
    return {
        key: torch.tensor([PEAKED.get(a, 0.0) for a in legal], dtype=torch.float64)
        for key, legal in LEGAL.items()
    }


def table(logits: dict[str, torch.Tensor]) -> dict[str, dict[int, float]]:
    return {
        k: dict(zip(LEGAL[k], torch.softmax(v, 0).tolist(), strict=True)) for k, v in logits.items()
    }


def run(v: Variant, steps: int) -> list[float]:
    """The table's exploitability after each of ``steps`` exact MMD steps."""
    policy = peaked_start()
    magnet = {
        k: torch.zeros_like(x) if v.magnet == "uniform" else x.clone() for k, x in policy.items()
    }
    out = []
    for step in range(1, steps + 1):
        q = state_action_values(GAME, table(policy))
        for key, logits in policy.items():
            values = torch.tensor([q[key][a] for a in LEGAL[key]], dtype=torch.float64)
            rho = torch.log_softmax(magnet[key] / v.temperature, 0)
            policy[key] = mmd_target(torch.log_softmax(logits, 0), rho, values, v.eta, v.alpha)
        if step % v.every == 0:
            for key in magnet:
                magnet[key] = (1 - v.mix) * magnet[key] + v.mix * policy[key]
        out.append(exploitability(GAME, table(policy)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = {v.name: run(v, args.steps) for v in VARIANTS}
    if args.json:
        print(json.dumps(rows))
        return
    marks = [s for s in (5, 10, 15, 20, 25, 30, 40, 50, 60) if s <= args.steps]
    print("| variant | " + " | ".join(f"step {s}" for s in marks) + " | max over the last half |")
    print("|---|" + "---:|" * (len(marks) + 1))
    for name, xs in rows.items():
        late = max(xs[len(xs) // 2 :])
        print(f"| {name} | " + " | ".join(f"{xs[s - 1]:.3f}" for s in marks) + f" | {late:.3f} |")


if __name__ == "__main__":
    main()
