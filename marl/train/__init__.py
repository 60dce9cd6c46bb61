"""The multi-agent GRPO trainer: estimators, the loss, the learner, leagues, runtimes, the loop.

``Trainer(cfg, run_dir).fit()`` trains a team config's adapters (and a learnable topology) on
its game or cooperative task; the pieces it is made of are public so that a benchmark or a
user's own loop can reuse them:

- advantage estimators (``make_estimator(name)``, ``ESTIMATORS``, ``Samples``, ``Advantages``,
  ``remove_common_mode``) and the clipped ``grpo_loss`` (math in docs/algorithms.md);
- ``Learner`` (updates of the LoRA adapters on one base model, by an objective of
  :mod:`marl.train.objectives`: GRPO or fitted policy targets, for choice or think roles)
  and ``League`` (snapshot opponents);
- ``Runtime`` (where rollouts and updates run: ``LocalRuntime`` or ``RayRuntime``);
- checkpoints (``save_checkpoint``, ``load_checkpoint``: safetensors, PEFT and JSON only).
"""

from marl.train.advantages import (
    ESTIMATORS,
    Advantages,
    Samples,
    make_estimator,
    remove_common_mode,
)
from marl.train.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from marl.train.league import League
from marl.train.learner import Learner, TrainItem, UpdateStats
from marl.train.loss import grpo_loss
from marl.train.objectives import (  # noqa: F401  (importing registers them)
    grpo,
    policy_target,
    think_target,
)
from marl.train.runtime import LocalRuntime, RayRuntime, Runtime
from marl.train.trainer import StepResult, Trainer, TrainingError

__all__ = [
    "ESTIMATORS",
    "Advantages",
    "Checkpoint",
    "League",
    "Learner",
    "LocalRuntime",
    "RayRuntime",
    "Runtime",
    "Samples",
    "StepResult",
    "TrainItem",
    "Trainer",
    "TrainingError",
    "UpdateStats",
    "grpo_loss",
    "load_checkpoint",
    "make_estimator",
    "remove_common_mode",
    "save_checkpoint",
]
