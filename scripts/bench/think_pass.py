"""Benchmark the learner's think-then-act pass: one forward per context against two, in one run.

A think decision is a sampled reasoning, then a choice scored after it.  The learner needs the
reasoning tokens' log-probs (and entropies) and the legal actions' scores after the reasoning,
with gradients.  ``ModelHost.reasoned_stats`` reads both off one forward over each context
(prompt, reasoning, separator); the baseline runs the reasoning's sequence and then the choice
scoring after it, two forwards over the same tokens.  The script samples the reasonings with
SmolLM2 on Kuhn positions, checks both ways agree to 1e-4, then times forward + backward.

With ``--reads G`` the decisions are G reasonings at each of ``decisions / G`` positions (as
``train.rollout: states`` asks them), and a third way runs the one pass with every context
after one head common to all instead of each position's prompt once after it.

A rollout table times the sampling side (``policy.act``: the reasonings, then the moves scored
after them) with each position's prompt run once for its G reasonings against one head shared
by all rows (``host.share_prompts = False``), in the same run.

A further table times the forward alone, as the think-targets fit evaluates its loss (the magnet's
mixtures, each length of the line search): the one pass with the reasoning's tokens scored
against ``ModelHost.move_scores``, the moves' scores alone (what ``reasoning_weight: 0`` needs).

    .venv/bin/python -m scripts.bench.think_pass                  # 16 decisions, 32 tokens
    .venv/bin/python -m scripts.bench.think_pass --decisions 48 --reads 4
    .venv/bin/python -m scripts.bench.think_pass --decisions 48 --reads 4 --tables fit
    .venv/bin/python -m scripts.bench.think_pass --decisions 48 --reads 4 --tables rollout
    .venv/bin/python -m scripts.bench.think_pass --decisions 32 --model tiny-random
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from collections.abc import Callable  # noqa: E402

warnings.filterwarnings("ignore")

import torch  # noqa: E402

from marl.agents import Agent  # noqa: E402
from marl.agents.hf_policy import HFPolicy  # noqa: E402
from marl.agents.host import ModelHost  # noqa: E402
from scripts.workloads import load_host, random_positions  # noqa: E402

THINK_PROMPT = "Think briefly about your card and the bets so far, in a sentence or two."


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--decisions", type=int, default=16)
    ap.add_argument("--think-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--reads", type=int, default=1, help="reasonings per position")
    ap.add_argument(
        "--tables",
        default="backward,fit",
        help="which tables: backward (forward + backward), fit (the fit's evaluations), "
        "rollout (sampling the reasonings and scoring the moves)",
    )
    args = ap.parse_args()
    if args.reads < 1 or args.decisions % args.reads:
        ap.error(f"--reads must divide --decisions ({args.decisions}), got {args.reads}")

    host = load_host(args.model)
    host.add_adapter("p", r=16, alpha=32, seed=0)
    policy = HFPolicy(
        host,
        "p",
        mode="think",
        temperature=1.0,
        seed=1,
        think_tokens=args.think_tokens,
        think_prompt=THINK_PROMPT,
    )
    agent = Agent("p", "player", policy, "You are a poker player in a game of kuhn_poker.", "think")
    requests = [
        agent.request(env, env.agent_selection)
        for env in random_positions("kuhn_poker", args.decisions // args.reads, 0, moves=4)
    ] * args.reads
    t = time.perf_counter()
    responses = policy.act(requests)
    print(
        f"sampled {len(responses)} reasonings in {time.perf_counter() - t:.1f} s; "
        f"prompt {statistics.mean(len(r.prompt_ids) for r in responses):.0f} tokens, "
        f"reasoning {statistics.mean(len(r.completion_ids) for r in responses):.1f}"
    )
    prompts = [r.prompt_ids for r in responses]
    reasonings = [r.completion_ids for r in responses]
    contexts = [r.choice_prompt_ids for r in responses]
    cands = [r.candidate_ids for r in responses]

    def two_passes():
        per, ents = host.sequence_stats(prompts, reasonings, 1.0, entropy=True)
        return per, ents, host.candidate_scores(contexts, cands)

    def one_pass():
        return host.reasoned_stats(prompts, reasonings, contexts, cands, 1.0, entropy=True)

    def one_head():
        host.share_prompts = False
        try:
            return one_pass()
        finally:
            host.share_prompts = True

    ways = {
        "two passes (reasoning, then choice scoring)": two_passes,
        "one pass (reasoned_stats)": one_pass,
    }
    if args.reads > 1:
        ways = {
            "two passes (reasoning, then choice scoring)": two_passes,
            "one pass, one head for all contexts": one_head,
            "one pass, each position's prompt once": one_pass,
        }
    tables = set(args.tables.split(","))
    if tables - {"backward", "fit", "rollout"}:
        ap.error(f"--tables takes backward, fit and rollout, got {args.tables}")
    if "rollout" in tables:
        rollout_table(host, policy, requests, args.repeats)
    if "backward" in tables:
        backward_table(host, ways, len(responses), args.repeats)
    if "fit" in tables:
        fit_table(host, prompts, contexts, cands, one_pass, args.repeats)
    print(f"load average {os.getloadavg()[0]:.2f}")


def backward_table(
    host: ModelHost, ways: dict[str, Callable], decisions: int, repeats: int
) -> None:
    """Forward + backward of each way, after checking they agree with the first."""
    host.model.train()
    times: dict[str, list[float]] = {k: [] for k in ways}
    with host.use("p"):
        first, *others = ways.values()
        ref = [x.detach() for part in first() for x in part]
        for fn in others:
            got = [x.detach() for part in fn() for x in part]
            assert all(torch.allclose(a, b, atol=1e-4) for a, b in zip(ref, got, strict=True))
        for _ in range(repeats):
            for name, fn in ways.items():
                t = time.perf_counter()
                torch.stack([x.sum() for part in fn() for x in part]).sum().backward()
                host.model.zero_grad()
                times[name].append(time.perf_counter() - t)
    table(f"forward + backward, {decisions} decisions", times, repeats)


def rollout_table(host: ModelHost, policy: HFPolicy, requests: list, repeats: int) -> None:
    """``policy.act`` with one head for all rows, then each position's prompt once."""
    times: dict[str, list[float]] = {"one head for all rows": [], "each position's prompt once": []}
    for _ in range(repeats):
        for name, shared in zip(times, (False, True), strict=True):
            host.share_prompts = shared
            t = time.perf_counter()
            policy.act(requests)
            times[name].append(time.perf_counter() - t)
    host.share_prompts = True
    table(
        f"rollout: {len(requests)} reasonings sampled, the moves scored after them", times, repeats
    )


def fit_table(
    host: ModelHost,
    prompts: list[list[int]],
    contexts: list[list[int]],
    cands: list[list[list[int]]],
    one_pass: Callable,
    repeats: int,
) -> None:
    """The forward alone, as the fit evaluates its loss: with the reasoning scored or not."""
    scoring = {
        "one pass, the reasoning's tokens scored too": lambda: one_pass()[2],
        "the moves alone (move_scores)": lambda: host.move_scores(prompts, contexts, cands),
    }
    host.model.eval()
    times = {k: [] for k in scoring}
    with torch.no_grad(), host.use("p"):
        first, alone = scoring.values()
        assert all(torch.allclose(a, b, atol=1e-4) for a, b in zip(first(), alone(), strict=True))
        for _ in range(repeats):
            for name, fn in scoring.items():
                t = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t)
    table(f"the fit's evaluations: forward alone, {len(prompts)} decisions", times, repeats)


def table(title: str, times: dict[str, list[float]], repeats: int) -> None:
    """A markdown table of the median seconds of each way, and its speed-up over the first."""
    base = statistics.median(next(iter(times.values())))
    print(f"\n{title}, median of {repeats}")
    print("| way | seconds | speed-up |\n|---|---:|---:|")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"| {name} | {med:.2f} | {base / med:.2f}x |")


if __name__ == "__main__":
    main()
