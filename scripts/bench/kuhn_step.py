"""Seconds of one Kuhn self-play training step, engine by engine: choice decoding with 128 games
and free text with 64, as ``configs/kuhn_selfplay.yaml`` trains (league, entropy, common mode),
and think-then-act with 64, as ``configs/kuhn_think.yaml`` trains (32 reasoning tokens).

Each variant runs in a fresh interpreter: ``Trainer`` on the config with the variant's backend
and precisions, ``--steps`` steps (the first warms up: model conversion, first-call
allocations, engine start-up), and the figures of the last step (rollout, update, whole step)
are printed next to the default engine's (transformers fp32) of the same run, with games per
minute and their ratio to choice decoding's in the same precision.  The free-text variants
sample 24 new tokens at temperature 1.

    .venv/bin/python -m scripts.bench.kuhn_step                 # SmolLM2-135M
    .venv/bin/python -m scripts.bench.kuhn_step --model tiny-random-vllm --steps 2
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch: see cli/__init__.py
os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import argparse  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from scripts.workloads import REPO, recipe  # noqa: E402

#: (label, decoding mode, backend, rollout precision, learner precision)
VARIANTS = [
    ("choice, transformers fp32", "choice", "hf", "fp32", "fp32"),
    ("choice, transformers bf16", "choice", "hf", "bf16", "bf16"),
    ("choice, vLLM-CPU fp32, learner bf16", "choice", "vllm", "fp32", "bf16"),
    ("free, transformers fp32", "free", "hf", "fp32", "fp32"),
    ("free, transformers bf16", "free", "hf", "bf16", "bf16"),
    ("free, vLLM-CPU bf16, learner bf16", "free", "vllm", "bf16", "bf16"),
    ("think, transformers fp32", "think", "hf", "fp32", "fp32"),
    ("think, transformers bf16", "think", "hf", "bf16", "bf16"),
    ("think, vLLM-CPU bf16, learner bf16", "think", "vllm", "bf16", "bf16"),
    ("think, vLLM-CPU fp32, learner fp32", "think", "vllm", "fp32", "fp32"),
]
#: The recipe each decoding mode trains as.
RECIPES = {"choice": "kuhn_selfplay", "free": "kuhn_selfplay", "think": "kuhn_think"}


def config(model: str, mode: str, backend: str, rollout: str, learner: str, steps: int):
    sampling = {"temperature": 1.0, "max_new_tokens": 24} if mode == "free" else {}
    cfg = recipe(RECIPES[mode], model, backend, mode=mode, precision=rollout, **sampling)
    games = {"group_size": 8, "groups_per_step": 16 if mode == "choice" else 8}
    train = cfg.train.replace(
        steps=steps,
        max_minutes=None,
        eval_every=0,
        checkpoint_every=10**6,
        precision=learner,
        **games,
    )
    return cfg.replace(train=train)


def run_variant(args: argparse.Namespace) -> dict:
    from marl.train import Trainer

    cfg = config(args.model, args.mode, args.backend, args.rollout, args.learner, args.steps)
    with tempfile.TemporaryDirectory(prefix="marl-bench-kuhn-") as run:
        t = time.perf_counter()
        trainer = Trainer(cfg, Path(run))
        start = time.perf_counter() - t
        history = trainer.fit()
    last = history[-1]
    sec = last["seconds"]
    return {
        "start_s": start,
        "rollout_s": sec["rollout"],
        "update_s": sec["update"],
        "step_s": sum(sec.values()),
        "episodes": last["episodes"],
        "decisions": last["decisions"],
        "parse_error_rate": last["parse_error_rate"],
        "tokens_per_s": last["tokens_per_s"],
    }


def games_per_min(r: dict | None) -> float | None:
    return None if not r or "error" in r else 60.0 * r["episodes"] / r["step_s"]


def row(variant: tuple[str, ...], results: dict[str, dict]) -> list[str]:
    """One table row: the variant's step against transformers fp32 in its mode, and its games
    per minute against choice decoding's on transformers in the same rollout precision."""
    label, mode, _, rollout, _ = variant
    r = results[label]
    if "error" in r:
        return [label, "failed: " + r["error"][:60], *[""] * 7]
    fp32 = results.get(next(v[0] for v in VARIANTS if v[1:4] == (mode, "hf", "fp32")))
    choice = results.get(next(v[0] for v in VARIANTS if v[1:4] == ("choice", "hf", rollout)))
    ratio = f"{fp32['step_s'] / r['step_s']:.2f}x" if fp32 and "error" not in fp32 else ""
    pace, choice_pace = games_per_min(r), games_per_min(choice)
    return [
        label,
        str(r["episodes"]),
        f"{r['rollout_s']:.1f}",
        f"{r['update_s']:.1f}",
        f"{r['step_s']:.1f}",
        ratio,
        f"{pace:.0f}",
        f"1/{choice_pace / pace:.1f}" if choice_pace and mode != "choice" else "",
        f"{r['parse_error_rate']:.2f}",
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--only", default="", help="comma-separated variant numbers (1-based)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    for flag in ("--mode", "--backend", "--rollout", "--learner"):
        p.add_argument(flag, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(run_variant(args)))
        return
    from rich.console import Console
    from rich.table import Table

    print(f"load average at start: {os.getloadavg()}", flush=True)
    chosen = [int(k) for k in args.only.split(",") if k] or range(1, len(VARIANTS) + 1)
    results: dict[str, dict] = {}
    for k in chosen:
        label, mode, backend, rollout, learner = VARIANTS[k - 1]
        cmd = [
            sys.executable,
            "-m",
            "scripts.bench.kuhn_step",
            "--child",
            "--model",
            args.model,
            "--steps",
            str(args.steps),
            "--mode",
            mode,
            "--backend",
            backend,
            "--rollout",
            rollout,
            "--learner",
            learner,
        ]
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        if proc.returncode:
            results[label] = {"error": (proc.stderr.strip().splitlines() or ["failed"])[-1]}
        else:
            results[label] = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"  {label}: {results[label]}", flush=True)
    table = Table(title=f"one Kuhn training step, {args.model} (step {args.steps})")
    for col in (
        "variant",
        "games",
        "rollout s",
        "update s",
        "step s",
        "speed-up vs fp32",
        "games/min",
        "vs choice",
        "parse errors",
    ):
        table.add_column(col, justify="left" if col == "variant" else "right")
    for k in chosen:
        table.add_row(*row(VARIANTS[k - 1], results))
    Console().print(table)
    print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
