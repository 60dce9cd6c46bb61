"""How far a 2-rank learner group's updates are from one process's (train.learner.ranks).

On the tiny random model in fp32, two adapters of three agents each: the same three batches of
choice decisions go to one in-process learner and to a learner group of 2 Ray actors (one
gloo group), for the torch backend and DeepSpeed ZeRO-1, ZeRO-2 and ZeRO-3.  Prints, per
backend, the largest |w_2 - w_1| over every adapter weight after the three updates and the
largest relative gap of the per-update gradient norms.  ``scripts/gpu_check.py`` runs the
same comparison on a GPU (NCCL) and between backends.

    .venv/bin/python -m scripts.bench.learner_ranks
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch: see cli/__init__.py
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import random  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import ray  # noqa: E402

from marl.agents.builder import build_roster  # noqa: E402
from marl.config import TeamConfig, load_config_text  # noqa: E402
from marl.train.group import LearnerGroup  # noqa: E402
from marl.train.learner import TrainItem  # noqa: E402
from marl.train.runtime import LearnerProcess, LearnerRank  # noqa: E402

TEAM = """\
schema: marl-teams/v1
name: ranks
roles:
  - {{name: player, model: {model}, adapter: {{r: 4, alpha: 8}}, decoding: {{mode: choice}}}}
  - {{name: rival, model: {model}, adapter: {{r: 4, alpha: 8}}, decoding: {{mode: choice}}}}
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


Call = Callable[..., Any]  # (method, *args) -> a learner's answer


def config(backend: str, stage: int, model: str = "tiny-random") -> dict:
    return load_config_text(TEAM.format(backend=backend, stage=stage, model=model)).model_dump(
        by_alias=True
    )


def one_process(cfg: dict, device: str = "cpu") -> Call:
    """A learner in this process, its model on ``device``, as a ``(method, *args)`` call."""
    roster = build_roster(TeamConfig.model_validate(cfg))
    roster.to(device)
    learner = LearnerProcess(cfg, cfg["roles"][0]["model"], roster)
    return lambda method, *args: getattr(learner, method)(*args)


def update_gaps(first: Call, second: Call, updates: int = 3) -> tuple[float, float]:
    """The same ``updates`` batches to both learners: the largest |w_2 - w_1| after them and
    the largest relative gap of the updates' gradient norms."""
    norm_gap = 0.0
    for seed in range(updates):
        a, b = first("update", batch(seed), seed), second("update", batch(seed), seed)
        norm_gap = max(norm_gap, abs(b.grad_norm - a.grad_norm) / a.grad_norm)
    w1, w2 = first("weights"), second("weights")
    weight_gap = max(
        float((w2[a][k].cpu() - v.cpu()).abs().max()) for a in w1 for k, v in w1[a].items()
    )
    return weight_gap, norm_gap


def gaps(
    backend: str, stage: int, model: str = "tiny-random", device: str = "cpu", ranks: int = 2
) -> tuple[float, float]:
    """One process against a learner group of ``ranks`` (one GPU each on ``cuda``: NCCL)."""
    cfg = config(backend, stage, model)
    one, gpus = one_process(cfg, device), 1.0 if device == "cuda" else 0.0
    group = LearnerGroup(ray.remote(LearnerRank), cfg, model, ranks, {"CPU": 0.5, "GPU": gpus})
    try:
        return update_gaps(one, group.call)
    finally:
        group.shutdown()


def main() -> None:
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    for backend, stage in (("torch", 1), ("deepspeed", 1), ("deepspeed", 2), ("deepspeed", 3)):
        w, n = gaps(backend, stage)
        name = backend if backend == "torch" else f"deepspeed ZeRO-{stage}"
        print(f"{name}: max |w_2 - w_1| {w:.2e}, max grad-norm gap {n:.2e} (relative)")
    ray.shutdown()


if __name__ == "__main__":
    main()
