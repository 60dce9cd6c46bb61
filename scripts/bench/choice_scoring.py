"""Benchmark choice-mode scoring: the prefix tree against one flat batch, in one run.

``ModelHost.candidate_scores`` runs the prompts' shared head once, each prompt's own tail once,
then its candidates as a prefix tree packed into the prompt's own row (a token that several
candidates begin with runs once; the prompt's KV cache is read in place), and projects to the
vocabulary only where a candidate token is predicted.  The baseline is the plain way: one
right-padded batch of every (prompt, candidate) sequence through the full model
(``sequence_logprobs`` on the flat pairs).  Both score the same positions of the same games;
the script checks they agree to 1e-4, then times each (no memo: weights are re-versioned
before every call), for inference and for a forward + backward.  Negotiation's moves are many
and long (up to 125 proposals of 10 tokens).

    .venv/bin/python -m scripts.bench.choice_scoring   # SmolLM2-135M; --games to pick
    .venv/bin/python -m scripts.bench.choice_scoring --model tiny-random
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import argparse  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

warnings.filterwarnings("ignore")

import torch  # noqa: E402

from marl.agents.host import ModelHost  # noqa: E402
from scripts.workloads import choice_requests, load_host, random_positions  # noqa: E402


def timed(fn, grad: bool) -> float:
    t = time.perf_counter()
    with torch.set_grad_enabled(grad):
        scores = fn()
        if grad:
            torch.stack([s.sum() for s in scores]).sum().backward()
    return time.perf_counter() - t


def bench_game(host: ModelHost, game: str, n: int) -> None:
    """Check that both ways agree on ``n`` positions of ``game``, then time them."""
    reqs = choice_requests(random_positions(game, n, 0, moves=4))
    prompts = [host.prompt_ids(r.messages)[0] for r in reqs]
    cands = [[host.text_ids(t) for t in r.action_texts] for r in reqs]
    flat_p = [p for p, cs in zip(prompts, cands, strict=True) for _ in cs]
    flat_c = [c for cs in cands for c in cs]

    def tree():
        host.clear_score_memo()  # never served from memory
        return host.candidate_scores(prompts, cands)

    def flat():
        per = host.sequence_logprobs(flat_p, flat_c)
        return [torch.stack([lp.sum() for lp in per])]

    with host.use("player"), torch.no_grad():
        a, b = torch.cat(tree()), flat()[0]
        assert torch.allclose(a, b, atol=1e-4), float((a - b).abs().max())
    flat_tokens = sum(len(p) + len(c) for p, c in zip(flat_p, flat_c, strict=True))
    distinct = {tuple(p) for p in prompts}
    tree_tokens = sum(len(p) for p in distinct) + sum(len(c) for c in flat_c)  # upper bound
    for grad in (False, True):
        with host.use("player"):
            t_tree, t_flat = timed(tree, grad), timed(flat, grad)
        print(
            f"| {game} | {'forward+backward' if grad else 'forward'} | "
            f"<= {tree_tokens} / {flat_tokens} | {t_tree:.2f} | {t_flat:.2f} | "
            f"{t_flat / t_tree:.2f}x |"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--positions", type=int, default=8)
    ap.add_argument("--games", nargs="+", default=["kuhn_poker", "tic_tac_toe", "negotiation"])
    args = ap.parse_args()
    host = load_host(args.model)
    host.add_adapter("player", r=8, alpha=16)
    print(
        f"model {args.model}; {args.positions} positions per game; load "
        f"{os.getloadavg()[0]:.2f}; torch threads {torch.get_num_threads()}"
    )
    print("| game | pass | tokens tree / flat | tree s | flat s | flat / tree |")
    print("|---|---|---|---|---|---|")
    for game in args.games:
        bench_game(host, game, args.positions)


if __name__ == "__main__":
    main()
