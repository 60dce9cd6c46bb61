"""How far a 2-rank learner group's updates are from one process's (train.learner.ranks).

On the tiny random model in fp32, two adapters of three agents each: the same three batches of
choice decisions go to one in-process learner and to a learner group of 2 Ray actors (one
gloo group), for the torch backend and DeepSpeed ZeRO-1 and ZeRO-2.  Prints, per backend, the
largest |w_2 - w_1| over every adapter weight after the three updates and the largest relative
gap of the per-update gradient norms.

    .venv/bin/python -m scripts.bench.learner_ranks
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch: see cli/__init__.py
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import random  # noqa: E402

import ray  # noqa: E402

from marl.config import load_config_text  # noqa: E402
from marl.train.group import LearnerGroup  # noqa: E402
from marl.train.learner import TrainItem  # noqa: E402
from marl.train.runtime import LearnerProcess, LearnerRank  # noqa: E402

TEAM = """\
schema: marl-teams/v1
name: ranks
roles:
  - {{name: player, model: tiny-random, adapter: {{r: 4, alpha: 8}}, decoding: {{mode: choice}}}}
  - {{name: rival, model: tiny-random, adapter: {{r: 4, alpha: 8}}, decoding: {{mode: choice}}}}
game: {{name: kuhn_poker}}
train:
  lr: 0.05
  max_grad_norm: 0.5
  learner: {{backend: {backend}, zero_stage: {stage}, micro_batch: 3}}
  ray: {{cpus_per_learner: 0.5}}
"""


def batch(seed: int, n: int = 14) -> list[TrainItem]:
    rng = random.Random(seed)
    items = []
    for i in range(n):
        cands = [[rng.randrange(3, 200) for _ in range(rng.randrange(1, 4))] for _ in range(3)]
        prompt = [rng.randrange(3, 200) for _ in range(5)]
        items.append(
            TrainItem(
                ("player", "rival")[i % 2], f"seat{i % 3}", prompt, cands[1], [-1.1],
                rng.uniform(-1, 1), cands, 1,
            )
        )  # fmt: skip
    return items


def gaps(backend: str, stage: int) -> tuple[float, float]:
    cfg = load_config_text(TEAM.format(backend=backend, stage=stage)).model_dump(by_alias=True)
    one = LearnerProcess(cfg, "tiny-random")
    group = LearnerGroup(ray.remote(LearnerRank), cfg, "tiny-random", 2, {"CPU": 0.5})
    try:
        norm_gap = 0.0
        for seed in range(3):
            a, b = one.update(batch(seed), seed), group.call("update", batch(seed), seed)
            norm_gap = max(norm_gap, abs(b.grad_norm - a.grad_norm) / a.grad_norm)
        w1, w2 = one.weights(), group.call("weights")
        weight_gap = max(float((w2[a][k] - v).abs().max()) for a in w1 for k, v in w1[a].items())
        return weight_gap, norm_gap
    finally:
        group.shutdown()


def main() -> None:
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    for backend, stage in (("torch", 1), ("deepspeed", 1), ("deepspeed", 2)):
        w, n = gaps(backend, stage)
        name = backend if backend == "torch" else f"deepspeed ZeRO-{stage}"
        print(f"{name}: max |w_2 - w_1| {w:.2e}, max grad-norm gap {n:.2e} (relative)")
    ray.shutdown()


if __name__ == "__main__":
    main()
