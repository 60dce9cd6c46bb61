"""Benchmark compute precision and shared prompt heads in the transformers path, in one run.

On one model (the tiny random one by default, SmolLM2-135M with ``--smollm2``):

* **free generation**: ``ModelHost.generate`` on ``--batch`` prompts that share a head (a
  seat's prompts: system prompt and rules, then its own state), sampling ``--max-new-tokens``
  at temperature 1, in fp32 and bf16 autocast, each with and without the shared head computed
  once (``share_prefix``).  Completion tokens (up to end-of-sequence) per wall second;
* **update**: one ``Learner.update`` (forward + backward + AdamW) on ``--train-batch`` free-text
  decisions of the same prompts, fp32 vs bf16.

The configurations alternate within each of ``--rounds`` rounds (the cores are shared, so the
load drifts), with the same seeds in every configuration; every ratio is against the fp32
baseline of this run.  The load average is printed with the figures.

    .venv/bin/python -m scripts.bench.precision              # tiny-random: plumbing check
    .venv/bin/python -m scripts.bench.precision --smollm2    # the figures in docs/benchmarks.md
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch: see cli/__init__.py
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import argparse  # noqa: E402
import random  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from collections import defaultdict  # noqa: E402

from scripts.workloads import load_host  # noqa: E402

RULES = (
    "Kuhn poker is played with three cards: Jack, Queen and King. Each player antes one "
    "chip and is dealt one card. The first player may check or bet one chip. After a "
    "check the second player may check (the higher card wins the pot) or bet; after a "
    "bet the other player may call (showdown) or fold (the bettor wins the pot). Answer "
    "with exactly one legal action in square brackets, for example [check] or [bet], "
    "and nothing else. Think about what your card tells you about the other player's "
    "card and about what a bet or a check says about your hand."
)
CARDS, MOVES = ("Jack", "Queen", "King"), ("check", "bet", "call", "fold")


def prompts(host, n: int, seed: int) -> list[list[int]]:
    """``n`` chat prompts that share the system prompt and the rules, each with its own state."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        history = ", ".join(rng.choice(MOVES) for _ in range(rng.randrange(1, 4)))
        state = (
            f"Game {i}. You hold the {rng.choice(CARDS)}. Your chips: {rng.randrange(1, 9)}."
            f" The moves so far: {history}. The pot holds {rng.randrange(2, 6)} chips. "
            f"Legal actions: [{rng.choice(MOVES)}] [{rng.choice(MOVES)}]."
        )
        out.append(
            host.prompt_ids(
                [
                    {"role": "system", "content": "You are player_0. " + RULES},
                    {"role": "user", "content": state},
                ]
            )[0]
        )
    return out


def generation(
    host, batch: list[list[int]], precision: str, share: bool, max_new: int, seed: int
) -> tuple[int, float]:
    from marl.agents.precision import autocast

    with host.use("player"), autocast(precision, host.device):
        t0 = time.perf_counter()
        comps, _ = host.generate(batch, max_new, 1.0, 1.0, seed, share_prefix=share)
        return sum(len(c) for c in comps), time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--smollm2", action="store_true", help="SmolLM2-135M-Instruct")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--train-batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    import torch

    from marl.agents.host.prefill import common_prefix
    from marl.config.train import TrainConfig
    from marl.train.learner import Learner, TrainItem

    model = "smollm2-135m-instruct" if args.smollm2 else "tiny-random"
    host = load_host(model)
    host.add_adapter("player", seed=0)
    batch = prompts(host, args.batch, seed=0)
    lens = [len(p) for p in batch]
    print(
        f"model {model}, threads {torch.get_num_threads()}, load average "
        f"{os.getloadavg()}; {len(batch)} prompts of {min(lens)}-{max(lens)} tokens, "
        f"shared head {common_prefix(batch)}"
    )

    gen: dict[tuple[str, bool], list[float]] = defaultdict(lambda: [0, 0.0])
    configs = [(p, s) for p in ("fp32", "bf16") for s in (False, True)]
    generation(host, batch[:2], "fp32", True, 2, 0)  # warm-up
    for r in range(args.rounds):
        for cfg in configs if r % 2 == 0 else configs[::-1]:
            tokens, seconds = generation(host, batch, *cfg, args.max_new_tokens, seed=r)
            gen[cfg][0] += tokens
            gen[cfg][1] += seconds
    base = gen[("fp32", False)][0] / gen[("fp32", False)][1]
    print("free generation (tokens/s, ratio to fp32 without sharing):")
    for (prec, share), (tokens, seconds) in gen.items():
        rate = tokens / seconds
        print(
            f"  {prec} {'shared head' if share else 'plain      '}  {rate:8.1f}  "
            f"{rate / base:5.2f}x  ({tokens} tokens, {seconds:.1f} s)"
        )

    with host.use("player"), torch.no_grad():
        train = batch[: args.train_batch]
        comps, logps = host.generate(train, args.max_new_tokens, 1.0, 1.0, 0)
    items = [
        TrainItem(
            adapter="player",
            agent="seat0",
            prompt_ids=p,
            completion_ids=c,
            old_logprobs=lp,
            advantage=(-1.0) ** i,
        )
        for i, (p, c, lp) in enumerate(zip(train, comps, logps, strict=True))
    ]
    learners = {
        p: Learner(TrainConfig(lr=1e-6, precision=p), host, ["player"]) for p in ("fp32", "bf16")
    }
    upd: dict[str, float] = defaultdict(float)
    learners["fp32"].update(items[:1])  # warm-up
    for r in range(args.rounds):
        for prec in ("fp32", "bf16") if r % 2 == 0 else ("bf16", "fp32"):
            t0 = time.perf_counter()
            learners[prec].update(items)
            upd[prec] += time.perf_counter() - t0
    tokens = sum(len(p) + len(c) for p, c in zip(train, comps, strict=True)) * args.rounds
    print(
        f"update, forward + backward + AdamW on {len(items)} sequences (tokens/s, ratio to fp32):"
    )
    for prec, seconds in upd.items():
        print(
            f"  {prec}  {tokens / seconds:8.1f}  {upd['fp32'] / seconds:5.2f}x  "
            f"({seconds / args.rounds:.2f} s per update)"
        )
    print(f"load average at the end {os.getloadavg()}")


if __name__ == "__main__":
    main()
