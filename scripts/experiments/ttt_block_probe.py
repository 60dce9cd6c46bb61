"""Can the tic-tac-toe policy learn to block from labelled positions, and carry it to new ones?

A supervised probe of the model behind ``configs/tictactoe_vs_random.yaml``: positions of
random play where the opponent has two in an open line and the player has no win of its own,
split into training and held-out boards.  The recipe's adapter is fitted by cross-entropy on
the blocking cells, ``-log sum_{a in block} pi(a | s)`` with ``pi`` the choice distribution
over the legal cells (the policy's own prompt and choice scoring), and the held-out
``pi(block)`` is printed as the fit goes.  No game outcome is involved: this bounds what the
RL recipe can get from a given number of positions.

    .venv/bin/python -m scripts.experiments.ttt_block_probe --train 320 --epochs 3
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import argparse  # noqa: E402
import random  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

warnings.filterwarnings("ignore")

import torch  # noqa: E402

from marl import games  # noqa: E402
from marl.agents.builder import build_roster  # noqa: E402
from marl.agents.host.prompts import role_prompts  # noqa: E402
from marl.agents.precision import autocast  # noqa: E402
from marl.config import load_config  # noqa: E402
from marl.games.base import TextGame  # noqa: E402
from marl.games.tictactoe import CROSS, NOUGHT, completing  # noqa: E402
from scripts.workloads import CONFIGS  # noqa: E402

CONFIG = CONFIGS / "tictactoe_vs_random.yaml"


def block_positions(n: int, seed: int) -> list[tuple[TextGame, list[int]]]:
    """``n`` distinct (position, blocking cells) from random play, either seat to move."""
    rng = random.Random(seed)
    found: dict[tuple[int, ...], tuple[TextGame, list[int]]] = {}
    for _ in range(1000 * n):  # the game has 1,484 such boards in all
        if len(found) >= n:
            break
        env = games.make("tic_tac_toe")
        env.reset(seed=rng.randrange(2**31))
        while not all(env.terminations.values()):
            mine = env.mark_of(env.agent_selection)
            blocks = completing(env.board, CROSS + NOUGHT - mine)
            if blocks and not completing(env.board, mine) and tuple(env.board) not in found:
                found[tuple(env.board)] = env.clone(), blocks
            env.step(rng.choice(env.legal_actions(env.agent_selection)))
    if len(found) < n:
        raise SystemExit(f"asked for {n} positions, random play found {len(found)}")
    boards = sorted(found)
    rng.shuffle(boards)
    return [found[b] for b in boards[:n]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train", type=int, default=320, help="training positions")
    ap.add_argument("--heldout", type=int, default=60, help="held-out positions")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--evals", type=int, default=4, help="held-out reads per epoch")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    cfg = load_config(CONFIG)
    roster = build_roster(cfg, seed=args.seed)
    agent = roster.agents[0]
    policy = agent.policy
    host, adapter = policy.host, policy.adapter
    positions = block_positions(args.train + args.heldout, args.seed)

    requests = [agent.request(env, env.agent_selection) for env, _ in positions]
    prompts, _ = role_prompts(host, requests, policy.max_prompt_tokens)
    data = [
        (
            prompt,
            [host.text_ids(t) for t in req.action_texts],
            [i for i, a in enumerate(req.legal) if a in blocks],
        )
        for prompt, req, (_, blocks) in zip(prompts, requests, positions, strict=True)
    ]
    train, held = data[: args.train], data[args.train :]
    print(
        f"{len(train)} training and {len(held)} held-out positions; prompts "
        f"{min(len(d[0]) for d in data)}-{max(len(d[0]) for d in data)} tokens; "
        f"precision {policy.precision}; load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )

    def block_logp(batch) -> torch.Tensor:
        scores = host.candidate_scores([d[0] for d in batch], [d[1] for d in batch])
        return torch.stack(
            [
                torch.logsumexp(torch.log_softmax(s.float(), 0)[d[2]], 0)
                for s, d in zip(scores, batch, strict=True)
            ]
        )

    def heldout() -> float:
        host.model.eval()
        with torch.no_grad(), host.use(adapter), autocast(policy.precision, host.device):
            p = torch.cat([block_logp(held[i : i + 32]).exp() for i in range(0, len(held), 32)])
        host.model.train()
        return float(p.mean())

    params = [p for p in host.model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=args.lr)
    rng = random.Random(args.seed)
    steps_per_epoch = -(-len(train) // args.batch)
    every = max(1, steps_per_epoch // args.evals)
    start = time.perf_counter()
    print(
        "| epoch | step | positions seen | minutes | training loss (since last) | "
        "held-out pi(block) |\n|---:|---:|---:|---:|---:|---:|"
    )
    print(f"| 0 | 0 | 0 | 0.0 | | {heldout():.3f} |", flush=True)
    step, losses = 0, []
    for epoch in range(1, args.epochs + 1):
        order = list(range(len(train)))
        rng.shuffle(order)
        for k in range(steps_per_epoch):
            batch = [train[i] for i in order[k * args.batch : (k + 1) * args.batch]]
            with host.use(adapter), autocast(policy.precision, host.device):
                loss = -block_logp(batch).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            losses.append(float(loss))
            if step % every == 0 or k == steps_per_epoch - 1:
                mins = (time.perf_counter() - start) / 60
                print(
                    f"| {epoch} | {step} | {step * args.batch} | {mins:.1f} | "
                    f"{sum(losses) / len(losses):.3f} | {heldout():.3f} |",
                    flush=True,
                )
                losses = []
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
