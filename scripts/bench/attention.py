"""Benchmark the host's grouped-query attention against transformers' ``sdpa``, in one run.

A learner pass in choice decoding: the candidate scores of ``--positions`` tic-tac-toe
positions (random play, seats mixed, prompts chunked by ``--micro-batch`` pairs as the learner
chunks them), forward and backward into a LoRA adapter on q/k/v/o.  Every batch carries an
attention mask, so ``sdpa`` copies each KV head to every query head it serves; ``sdpa_gqa``
reads them in place (``agents/attention.py``).  The two must agree (scores to 1e-4); the
passes alternate, ``--repeats`` each, and the medians and per-pair ratios are printed.

    .venv/bin/python scripts/bench/attention.py                      # SmolLM2-135M
    .venv/bin/python scripts/bench/attention.py --model tiny-random --positions 16
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import argparse  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
warnings.filterwarnings("ignore")

import torch  # noqa: E402

from marl import games  # noqa: E402
from marl.agents import Agent  # noqa: E402
from marl.agents.host import ModelHost  # noqa: E402
from marl.agents.models import load_model  # noqa: E402


def requests(n: int, seed: int) -> list:
    """Requests at ``n`` distinct tic-tac-toe positions of random play, seats mixed."""
    rng, seen, out = random.Random(seed), set(), []
    agents = {
        s: Agent(s, "player", None, mode="choice")  # type: ignore[arg-type]
        for s in ("player_0", "player_1")
    }
    while len(out) < n:
        env = games.make("tic_tac_toe")
        env.reset(seed=rng.randrange(10**6))
        for _ in range(rng.randrange(0, 7)):
            if env.terminations[env.agent_selection]:
                break
            env.step(rng.choice(env.legal_actions()))
        key = env.state_key()
        if not env.terminations[env.agent_selection] and key not in seen:
            seen.add(key)
            out.append(agents[env.agent_selection].request(env, env.agent_selection))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--positions", type=int, default=48)
    ap.add_argument(
        "--micro-batch",
        type=int,
        default=144,
        help="(prompt, candidate) pairs per forward, as train.learner.micro_batch",
    )
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    host = ModelHost(*load_model(args.model))
    host.add_adapter("player", r=16, alpha=32, targets=["q_proj", "k_proj", "v_proj", "o_proj"])
    for name, p in host.model.named_parameters():  # a trained-looking adapter
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.01, generator=torch.Generator().manual_seed(0))
    reqs = sorted(requests(args.positions, 0), key=lambda r: host.prompt_ids(r.messages)[0])
    chunks, pairs = [[]], 0
    for r in reqs:
        if pairs + len(r.action_texts) > args.micro_batch:
            chunks.append([])
            pairs = 0
        chunks[-1].append(
            (host.prompt_ids(r.messages)[0], [host.text_ids(t) for t in r.action_texts])
        )
        pairs += len(r.action_texts)
    params = [p for p in host.model.parameters() if p.requires_grad]

    def learner_pass(impl: str) -> tuple[float, torch.Tensor]:
        host.model.set_attn_implementation(impl)
        for p in params:
            p.grad = None
        out = []
        t = time.perf_counter()
        with host.use("player"):
            for chunk in chunks:
                scores = host.candidate_scores([p for p, _ in chunk], [c for _, c in chunk])
                torch.stack([s.logsumexp(0) - s[0] for s in scores]).sum().backward()
                out.append(torch.cat(scores).detach())
        return time.perf_counter() - t, torch.cat(out)

    print(
        f"model {args.model}; {len(reqs)} positions, {sum(len(r.action_texts) for r in reqs)} "
        f"candidates in {len(chunks)} micro-batches; torch threads {torch.get_num_threads()}; "
        f"load at start {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    learner_pass("sdpa_gqa")  # warm-up: first-call allocations
    times: dict[str, list[float]] = {"sdpa": [], "sdpa_gqa": []}
    for k in range(args.repeats):
        order = ("sdpa", "sdpa_gqa") if k % 2 == 0 else ("sdpa_gqa", "sdpa")
        scores = {}
        for impl in order:
            seconds, scores[impl] = learner_pass(impl)
            times[impl].append(seconds)
            print(f"  repeat {k + 1} {impl}: {seconds:.2f} s", flush=True)
        gap = float((scores["sdpa"] - scores["sdpa_gqa"]).abs().max())
        assert gap < 1e-4, f"the two attentions disagree by {gap}"
    ratios = [a / b for a, b in zip(times["sdpa"], times["sdpa_gqa"], strict=True)]
    print("| attention | median s (forward + backward) | vs sdpa |")
    print("|---|---|---|")
    print(f"| sdpa (KV heads copied) | {statistics.median(times['sdpa']):.2f} | 1.00x |")
    print(
        f"| sdpa_gqa (KV heads in place) | {statistics.median(times['sdpa_gqa']):.2f} | "
        f"{statistics.median(ratios):.2f}x (pairs {min(ratios):.2f}-{max(ratios):.2f}x) |"
    )
    print(f"load at end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
