"""Asynchronous rollouts with a staleness bound (``train.async``).

Versions: the weights the update of step ``s`` makes are version ``s`` (the initial ones 0);
the runtime's workers play with the version published last when a rollout was launched, and
stamp it on every episode (``Episode.policy_version``).  The update of step ``s`` starts from
version ``s - 1``, so an episode of version ``v`` is learnt from ``s - 1 - v`` updates late:

    staleness(episode at step s) = (s - 1) - v

With ``max_staleness`` k the rollouts of steps ``s + 1 .. s + k`` are launched before the
update of step ``s`` (planned, then started on the runtime's workers), so they are played while
the learner updates.  Launched at step ``s`` they play version ``s - 1``; collected at step
``s + j`` their staleness is ``j <= k``: a rollout that would be staler is never launched (the
workers wait instead), and a batch found staler all the same is refused
(:class:`StaleBatchError`).  The learner corrects for the gap with ``train.async.correction``
(:mod:`marl.train.loss`: decoupled PPO's proximal policy and importance weights).

k = 0 launches nothing ahead: each step plays, then updates, then publishes (the synchronous
loop, exactly).  Seeds still come from (run seed, step), so a run is the same for a given k;
what differs between k's is the weights each step's games were played with (and, planned
earlier, the league opponents' win rates they were drawn with).  A resumed run launches its
first steps after the checkpoint with the checkpoint's weights, so with k > 0 it replays them
with fresher weights than the lost run had.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, wait
from dataclasses import dataclass

import numpy as np

from marl.agents.rollout import Episode
from marl.train.runtime import Runtime
from marl.train.workers import EpisodeSpec


class StaleBatchError(RuntimeError):
    """A step's episodes were played with weights older than ``train.async.max_staleness``
    allows."""


@dataclass
class Rollout:
    """One step's games: their specs, and the episodes once played."""

    specs: list[EpisodeSpec]
    episodes: Future[list[Episode]]


def staleness(episodes: list[Episode], step: int, bound: int) -> dict[str, float]:
    """The largest and mean staleness of the episodes learnt from at ``step``; a
    :class:`StaleBatchError` above ``bound``."""
    ages = [step - 1 - ep.policy_version for ep in episodes] or [0]
    if max(ages) > bound:
        raise StaleBatchError(
            f"{max(ages)} updates stale, more than train.async.max_staleness ({bound}): refused"
        )
    return {"max": max(ages), "mean": float(np.mean(ages))}


class Rollouts:
    """The games of the coming steps, launched up to ``max_staleness`` steps ahead of the
    update and collected when their step's update comes (``take``, then ``ahead``).
    ``plan(step)`` gives a step's specs; no step after ``last`` is launched ahead."""

    def __init__(
        self,
        runtime: Runtime,
        plan: Callable[[int], list[EpisodeSpec]],
        seed: int,
        max_staleness: int,
        last: int,
    ) -> None:
        self.runtime, self.plan, self.seed = runtime, plan, seed
        self.max_staleness, self.last = max_staleness, last
        self.pending: dict[int, Rollout] = {}

    def _launch(self, step: int) -> None:
        if step not in self.pending:
            specs = self.plan(step)
            self.pending[step] = Rollout(specs, self.runtime.launch(specs, step, self.seed))

    def take(self, step: int) -> tuple[list[EpisodeSpec], list[Episode], dict[str, float]]:
        """Step ``step``'s specs, its episodes (played now unless launched before) and their
        staleness; the rollout's errors are raised here."""
        if self.max_staleness == 0:  # the synchronous loop
            specs = self.plan(step)
            episodes = self.runtime.play(specs, step, self.seed)
        else:
            self._launch(step)
            rollout = self.pending.pop(step)
            specs, episodes = rollout.specs, rollout.episodes.result()
        return specs, episodes, staleness(episodes, step, self.max_staleness)

    def ahead(self, step: int) -> None:
        """Before the update of ``step``: launch the rollouts of the next ``max_staleness``
        steps (those not launched yet), with the weights the workers have now."""
        for later in range(step + 1, min(step + self.max_staleness, self.last) + 1):
            self._launch(later)

    def close(self) -> None:
        """Drop the rollouts not started yet and wait for the one running (episodes and
        errors dropped): a run that ends leaves nothing playing on its workers."""
        for rollout in self.pending.values():
            rollout.episodes.cancel()
        wait([rollout.episodes for rollout in self.pending.values()])
        self.pending.clear()
