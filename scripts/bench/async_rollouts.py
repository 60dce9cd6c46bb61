"""Games per minute of one recipe's training, synchronous against asynchronous rollouts
(``train.async.max_staleness`` k = 0, 1, 2), on Ray workers.

Each k runs in a fresh interpreter with a local Ray of its own: ``Trainer`` on the recipe with
``--workers`` rollout workers, ``--steps`` steps, no evaluation or checkpoint in between.  The
figure is the steady state's: a step's games over the median wall time between the ends of
consecutive steps, over steps 2 to ``steps - 2`` for every k (the first warms up: model loads,
first-call allocations; the last k launch nothing ahead, so nothing competes with them).  The
largest staleness logged and the mean correction weight come with it, and each k's games per
minute is printed as a ratio to k = 0's of the same run.  Overlap pays where the workers and
the learner have cores (or GPUs) of their own: ``--cpus`` is the Ray CPUs, split between the
workers (``--cpus-per-worker`` each) and the learner (the rest).

    .venv/bin/python -m scripts.bench.async_rollouts                          # SmolLM2-135M
    .venv/bin/python -m scripts.bench.async_rollouts --recipe kuhn_think --backend vllm --groups 4
    .venv/bin/python -m scripts.bench.async_rollouts --model tiny-random --steps 5 --groups 2
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch: see cli/__init__.py
os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import argparse  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from scripts.workloads import REPO, recipe  # noqa: E402

STALENESS = (0, 1, 2)


def config(args: argparse.Namespace, k: int):
    cfg = recipe(args.recipe, args.model, args.backend)
    learner_cpus = args.cpus - args.workers * args.cpus_per_worker
    ray = cfg.train.ray.replace(
        enabled=True,
        rollout_workers=args.workers,
        cpus_per_worker=args.cpus_per_worker,
        cpus_per_learner=learner_cpus,
    )
    train = cfg.train.replace(
        steps=args.steps,
        max_minutes=None,
        eval_every=0,
        checkpoint_every=10**6,
        group_size=8,
        groups_per_step=args.groups,
        ray=ray,
        **{"async": {"max_staleness": k}},
    )
    return cfg.replace(train=train)


def run_k(args: argparse.Namespace) -> dict:
    import ray

    from marl.train import Trainer

    ray.init(address="local", num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
    ends: list[float] = []
    with tempfile.TemporaryDirectory(prefix="marl-bench-async-") as run:
        trainer = Trainer(config(args, args.k), Path(run))
        try:
            history = trainer.fit(on_step=lambda _: ends.append(time.perf_counter()))
        finally:
            trainer.runtime.shutdown()
            ray.shutdown()
    steady = ends[: args.steps - max(STALENESS)]
    seconds = statistics.median(b - a for a, b in itertools.pairwise(steady))
    weights = [
        w["is_weights"]["mean"] for h in history for w in h["learner"].values() if "is_weights" in w
    ]
    return {
        "games_per_min": 60 * history[-1]["episodes"] / seconds,
        "staleness_max": max(h["staleness"]["max"] for h in history),
        "is_weight_mean": sum(weights) / len(weights) if weights else None,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--recipe", default="kuhn_selfplay")
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--backend", choices=("hf", "vllm"), help="the role's backend (the recipe's)")
    p.add_argument("--steps", type=int, default=8, help="training steps per k")
    p.add_argument("--groups", type=int, default=16, help="groups of 8 games per step")
    p.add_argument("--workers", type=int, default=2, help="rollout workers")
    p.add_argument("--cpus", type=float, default=float(os.cpu_count() or 2), help="Ray CPUs")
    p.add_argument("--cpus-per-worker", type=float, default=0.75, help="Ray CPUs a worker takes")
    p.add_argument("--k", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.steps < 3 + max(STALENESS):
        p.error(
            f"--steps must be at least {3 + max(STALENESS)}: the figure is steps 2 to steps - 2"
        )
    if args.workers * args.cpus_per_worker >= args.cpus:
        p.error("--workers x --cpus-per-worker must leave some of --cpus to the learner")
    if args.k is not None:
        print(json.dumps(run_k(args)))
        return
    print(f"load average at start: {os.getloadavg()}", flush=True)
    results: dict[int, dict] = {}
    for k in STALENESS:
        cmd = [sys.executable, "-m", "scripts.bench.async_rollouts", *sys.argv[1:], "--k", str(k)]
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        if proc.returncode:
            results[k] = {"error": (proc.stderr.strip().splitlines() or ["failed"])[-1]}
        else:
            results[k] = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"  max_staleness {k}: {results[k]}", flush=True)
    base = results[0].get("games_per_min")
    engine = args.backend or "the recipe's backend"
    games = f"{args.groups * 8} games a step, {args.workers} workers"
    print(f"{args.recipe} on {args.model} ({engine}), {games}:")
    for k, r in results.items():
        if "error" in r:
            print(f"  k={k}: failed: {r['error']}")
            continue
        ratio = f"{r['games_per_min'] / base:.2f}x k=0" if base else "no k=0 figure"
        print(
            f"  k={k}: {r['games_per_min']:8.1f} games/min ({ratio}), staleness <= "
            f"{r['staleness_max']}, mean weight {r['is_weight_mean']}"
        )
    print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
