"""Bytes one training step moves between the driver, the rollout workers and the learner, as
Ray would ship them (pickled; tensors as their raw bytes), measured on a recipe's real step.

A runtime wrapper records what the trainer hands the runtime and gets back: the episode specs
(driver -> workers), the episodes (workers -> driver), the learner's items (driver -> learner
ranks), the trained adapters (learner -> driver, then driver -> workers) and the league pool
(driver -> workers).  Everything but the adapters grows with the games of a step: run it at a
few ``--groups`` and read the slope.  ``docs/scaling.md`` quotes it.

    .venv/bin/python -m scripts.bench.step_bytes                      # kuhn_target, SmolLM2
    .venv/bin/python -m scripts.bench.step_bytes --model tiny-random --groups 4
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch: see cli/__init__.py
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import argparse  # noqa: E402
import pickle  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from scripts.workloads import recipe, train_here  # noqa: E402


def size(obj: Any) -> int:
    return len(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


class Measured:
    """A runtime that forwards every call to ``inner`` and adds up what crosses it."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.bytes = inner, {}

    def add(self, what: str, obj: Any) -> None:
        self.bytes[what] = self.bytes.get(what, 0) + size(obj)

    def play(self, specs, step, seed):
        self.add("specs: driver -> workers", specs)
        episodes = self.inner.play(specs, step, seed)
        self.add("episodes: workers -> driver", episodes)
        return episodes

    def update(self, items, seed, lr=None):
        self.add("items: driver -> learner", items)
        return self.inner.update(items, seed, lr)

    def publish(self, weights, snapshots):
        self.add("adapters: driver -> workers", weights)
        self.add("league pool: driver -> workers", snapshots)
        self.inner.publish(weights, snapshots)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--recipe", default="kuhn_target")
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--groups", type=int, default=64, help="groups_per_step of the measured step")
    args = p.parse_args()
    from marl.train import Trainer
    from marl.train.runtime import LocalRuntime

    cfg = recipe(args.recipe, args.model)
    train = train_here(cfg.train, 1, groups_per_step=args.groups, eval_every=0)
    cfg = cfg.replace(train=train.replace(checkpoint_every=10**6))
    runtime = Measured(LocalRuntime(cfg))
    with tempfile.TemporaryDirectory(prefix="marl-bench-bytes-") as run:
        result = Trainer(cfg, Path(run), runtime=runtime).train_step()
    weights = runtime.weights()
    params = sum(t.numel() for sd in weights.values() for t in sd.values())
    print(f"{args.recipe} on {args.model}: {result.metrics['episodes']} games, "
          f"{result.metrics['decisions']} decisions, {params} adapter parameters")  # fmt: skip
    for what, n in runtime.bytes.items():
        print(f"  {what}: {n} bytes")
    print(f"  adapters: learner -> driver: {size(weights)} bytes")


if __name__ == "__main__":
    main()
