"""The DeepSpeed learner backend on CPU: the same batches give the same updates as the torch
backend (loss, gradient norms, weights, AdamW moments), non-finite batches are dropped without
leaving stale gradients, optimizer states move between the backends, and a Trainer run with
``backend: deepspeed`` equals the torch run step for step, also across a resume.

Everything is fp32 on one process (world size 1), so ZeRO's flattened partitions hold the
same numbers as the torch parameters and the comparison can be tight.  ZeRO-3 runs with a
persistence threshold of 0, so even the tiny model's parameters really are partitioned.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

pytest.importorskip("deepspeed")

from helpers import build_tiny_host, metrics_rows, tiny_team, train_config  # noqa: E402
from marl.agents.host import ModelHost  # noqa: E402
from marl.config import load_config_text  # noqa: E402
from marl.train.learner import Learner, TrainItem  # noqa: E402
from marl.train.optim import DeepSpeedAdamW, TorchAdamW, deepspeed_config  # noqa: E402
from marl.train.trainer import Trainer  # noqa: E402

ADAPTERS = ["red", "blue"]
PARTITION_ALL = {"zero_optimization": {"stage3_param_persistence_threshold": 0}}


def _host() -> ModelHost:
    return build_tiny_host(*ADAPTERS)


class PairScoredAdamW(TorchAdamW):
    """torch AdamW with the scoring ZeRO-3 makes the learner use (one forward per
    micro-batch), so that the two differ only in the optimizer's arithmetic."""

    collective_forwards = True


def _learner(backend: str | int, scoring_of: int = 1) -> Learner:
    """Two adapters on one base, lr high enough that moments and clipping matter; a torch
    learner scores as ZeRO stage ``scoring_of`` makes the learner score."""
    if backend == "torch":
        return Learner(
            train_config(lr=0.05, max_grad_norm=0.5, learner={"micro_batch": 4}),
            _host(),
            ADAPTERS,
            optimizer=PairScoredAdamW if scoring_of == 3 else TorchAdamW,
        )
    return Learner(
        train_config(lr=0.05, max_grad_norm=0.5, learner={"micro_batch": 4}),
        _host(),
        ADAPTERS,
        optimizer=lambda model, params, lr, max_grad_norm: DeepSpeedAdamW(
            model,
            params,
            lr,
            max_grad_norm,
            zero_stage=backend,
            extra=PARTITION_ALL if backend == 3 else None,
        ),
    )


def _batch(seed: int, n: int = 12) -> list[TrainItem]:
    """Choice decisions of three agents per adapter, with random advantages."""
    rng = random.Random(seed)
    items = []
    for i in range(n):
        cands = [[rng.randrange(3, 200) for _ in range(3)] for _ in range(3)]
        items.append(
            TrainItem(
                adapter=ADAPTERS[i % 2],
                agent=f"seat{i % 3}",
                prompt_ids=[rng.randrange(3, 200) for _ in range(6)],
                completion_ids=cands[1],
                old_logprobs=[-1.1],
                advantage=rng.uniform(-1, 1),
                candidate_ids=cands,
                choice=1,
            )
        )
    return items


def _same_update(a, b) -> None:
    assert not a.skipped and not b.skipped
    assert b.loss == pytest.approx(a.loss, rel=1e-5, abs=1e-7)
    assert b.grad_norm == pytest.approx(a.grad_norm, rel=1e-5)
    assert b.agent_grad_norms.keys() == a.agent_grad_norms.keys()
    for k, v in a.agent_grad_norms.items():
        assert b.agent_grad_norms[k] == pytest.approx(v, rel=1e-5)


def _same_weights(a: Learner, b: Learner) -> None:
    """ZeRO-1/2 match to the bit here; ZeRO-3 reduces its partitions in another order, and
    AdamW's m / sqrt(v) turns float-rounding differences into ~1e-6 where v is tiny."""
    wa, wb = a.weights(), b.weights()
    for adapter in wa:
        for k, v in wa[adapter].items():
            torch.testing.assert_close(wb[adapter][k], v, rtol=1e-4, atol=1e-5)


def _same_state(a: dict, b: dict) -> None:
    assert a["param_groups"][0].keys() == b["param_groups"][0].keys()
    assert a["state"].keys() == b["state"].keys()
    for i, st in a["state"].items():
        for key in ("step", "exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(
                b["state"][i][key].float(), st[key].float(), rtol=1e-5, atol=1e-7
            )


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_updates_equal_the_torch_backend(stage: int) -> None:
    ref, ds = _learner("torch", scoring_of=stage), _learner(stage)
    _same_weights(ref, ds)
    for seed in range(3):
        _same_update(ref.update(_batch(seed)), ds.update(_batch(seed)))
        _same_weights(ref, ds)
    # a scheduled learning rate reaches ZeRO's partitions as it reaches torch's AdamW
    _same_update(ref.update(_batch(8), lr=0.01), ds.update(_batch(8), lr=0.01))
    _same_weights(ref, ds)
    assert ref.update(_batch(9)).grad_norm > 0.5  # clipping was exercised
    ds.update(_batch(9))
    _same_state(ref.optimizer_state(), ds.optimizer_state())

    # a NaN advantage mid-batch: nothing applied, and nothing left over for the next step
    bad = _batch(5)
    bad[7].advantage = float("nan")
    before = ds.weights()
    assert ds.update(bad).skipped and ref.update(bad).skipped
    after = ds.weights()
    assert all(torch.equal(before[a][k], after[a][k]) for a in before for k in before[a])
    _same_update(ref.update(_batch(6)), ds.update(_batch(6)))
    _same_weights(ref, ds)


def test_optimizer_state_moves_between_backends() -> None:
    """Checkpoints hold torch AdamW's per-parameter format whichever backend wrote them."""
    ref = _learner("torch")
    for seed in range(2):
        ref.update(_batch(seed))
    ds = _learner(1)
    ds.load(ref.weights(), ref.optimizer_state())  # torch -> DeepSpeed
    _same_state(ref.optimizer_state(), ds.optimizer_state())
    _same_update(ref.update(_batch(2)), ds.update(_batch(2)))
    back = _learner("torch")
    back.load(ds.weights(), ds.optimizer_state())  # DeepSpeed -> torch
    _same_update(ref.update(_batch(3)), back.update(_batch(3)))
    _same_weights(ref, back)


def test_half_precision_only_on_a_gpu() -> None:
    cfg = deepspeed_config(2, 0.7, torch.device("cpu"))
    assert not cfg["bf16"]["enabled"] and not cfg["fp16"]["enabled"]
    assert cfg["zero_optimization"]["stage"] == 2 and cfg["gradient_clipping"] == 0.7
    assert cfg["managed_gradient_accumulation"] is False
    with pytest.raises(ValueError, match="torch backend"):
        deepspeed_config(0, 1.0, torch.device("cpu"))


# --- through the trainer -----------------------------------------------------------------

KUHN_LEAGUE = """\
  steps: {steps}
  group_size: 4
  groups_per_step: 2
  lr: 0.02
  checkpoint_every: 1
  eval_every: 0  # off: a run cut short evaluates its last step, a whole one does not
  ray: {{enabled: false}}
  league: {{opponents: league, snapshot_every: 1, anchors: [random]}}
"""


def _run(
    tmp_path: Path, name: str, backend: str, resume: bool = False, steps: int = 3
) -> list[dict]:
    text = tiny_team("kuhn_poker", KUHN_LEAGUE.format(steps=steps))
    if backend == "ds":
        text += "  learner: {backend: deepspeed, zero_stage: 1}\n"
    Trainer(load_config_text(text), tmp_path / name, resume=resume).fit()
    return metrics_rows(tmp_path / name)


def _close(a, b) -> bool:
    """Metrics equal up to float rounding (the backends sum in different orders)."""
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, float):
        return b == pytest.approx(a, rel=1e-4, abs=1e-6)
    return a == b


def test_trainer_with_deepspeed_equals_torch_and_resumes(tmp_path: Path) -> None:
    """Kuhn poker with league snapshots: rewards, losses and per-agent gradient norms of a
    DeepSpeed run equal the torch run's, and stopping at step 2 then resuming to step 3
    (weights and AdamW state from the checkpoint) changes nothing."""
    torch_rows = _run(tmp_path, "torch", "torch")
    ds_rows = _run(tmp_path, "ds", "ds")
    assert [r["step"] for r in ds_rows] == [1, 2, 3]
    assert any(r["learner"] for r in ds_rows)  # some steps did update
    assert all(_close(t, d) for t, d in zip(torch_rows, ds_rows, strict=True))
    _run(tmp_path, "resumed", "ds", steps=2)
    resumed = _run(tmp_path, "resumed", "ds", resume=True)
    assert all(_close(t, d) for t, d in zip(ds_rows, resumed, strict=True))
