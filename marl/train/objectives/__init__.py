"""What an update does with the learner's log-probs: one objective per module.

An objective is made from a :class:`~marl.train.learner.Learner` (its passes, optimizer and
config) and turns a batch into one update.  Modules register theirs under a name
(:func:`register_objective`); the config picks the name (:func:`objective_name`).

- ``grpo`` (:mod:`.grpo`): the clipped GRPO step, with the mismatch correction, dual clip and
  magnet KL;
- ``policy_target`` (:mod:`.policy_target`): MMD's closed-form targets, fitted by the model;
  it hands batches of think decisions to
- ``think_target`` (:mod:`.think_target`): the same targets for think-then-act roles, fitted
  through the mixture over the sampled reasonings, the reasoning trained by the advantage.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from marl.config.train import TrainConfig

if TYPE_CHECKING:
    from marl.train.learner import Learner, TrainItem, UpdateStats


class Objective(Protocol):
    def __init__(self, learner: Learner) -> None: ...

    def update(self, items: list[TrainItem]) -> UpdateStats: ...


OBJECTIVES: dict[str, type[Objective]] = {}


def register_objective(name: str) -> Callable[[type[Objective]], type[Objective]]:
    def add(cls: type[Objective]) -> type[Objective]:
        OBJECTIVES[name] = cls
        return cls

    return add


def objective_name(cfg: TrainConfig) -> str:
    """``policy_target`` when ``train.policy_target.eta > 0`` (the update fits MMD's targets),
    else ``grpo``."""
    return "policy_target" if cfg.policy_target.eta > 0 else "grpo"
