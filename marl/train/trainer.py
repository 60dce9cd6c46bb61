"""The multi-agent GRPO training loop.

One step:
  1. plan ``groups_per_step`` groups of ``group_size`` games; the games of a group share their
     seed (same deal) and their seating, so their outcomes differ only by the agents' choices;
  2. play them (runtime workers, batched rollouts); with ``train.async.max_staleness`` k > 0
     the next k steps' games are launched before this step's update, so they play while it
     runs (:mod:`marl.train.asynchrony`);
  3. turn every decision of a trainable agent into a sample (reward, group, agent) and apply the
     configured advantage estimator;
  4. one GRPO update per trainable base model, then publish the new weights;
  5. log metrics, snapshot into the league, checkpoint.

Team-task runs (``train.rollout: team``) play the same loop with a team answering cooperative
tasks in free text (a group: one task, ``group_size`` answers); with a learnable topology a
graph is sampled per episode in step 1 and its edge logits get a REINFORCE update next to the
GRPO update in step 4 (:mod:`marl.train.topology`); ``train.policies: frozen`` skips the GRPO part.
States runs (``train.rollout: states``) replace the games of steps 1-2 by decisions at every
information state, valued on the game's tree before step 3 (:mod:`marl.train.states`).

Seeds of step ``s`` derive from (run seed, s) only, so a run resumed from a checkpoint replays
exactly the steps it lost.
"""

from __future__ import annotations

import importlib.util
import random
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from marl import games
from marl.agents.checks import team_problems
from marl.agents.policy import PolicyError
from marl.agents.rollout import Episode, Turn
from marl.agents.tables import TABLE_BACKENDS
from marl.config import TeamConfig
from marl.config.rules import something_to_train
from marl.config.schema import dotted
from marl.games.bots import bot_names
from marl.infra import budget
from marl.infra.actors import ActorPoolError
from marl.infra.layout import resume_point, sweep_orphans
from marl.infra.seats import ParticipantId
from marl.infra.seeds import derive_seed
from marl.train.advantages import (
    Advantages,
    RoleBaseline,
    Samples,
    make_estimator,
    remove_common_mode,
)
from marl.train.asynchrony import Rollouts, StaleBatchError
from marl.train.best import BestCheckpoint
from marl.train.checkpoint import load_checkpoint, save_checkpoint
from marl.train.league import League
from marl.train.learner import TrainItem
from marl.train.loggers import open_loggers, unavailable
from marl.train.magnet import Magnet
from marl.train.metrics import StepMetrics
from marl.train.runtime import LocalRuntime, RayRuntime, Runtime, trainable_hosts
from marl.train.states import plan_states, value_states
from marl.train.topology import graph_strategy
from marl.train.workers import EpisodeSpec

TRAINEE = ParticipantId.team(0)  # the agent that meets league opponents
# train.reward: what a decision's return is, from the episode and the deciding seat
RETURNS: dict[str, Callable[[Episode, str], float]] = {
    "individual": lambda ep, agent: ep.returns[agent],
    "team": lambda ep, agent: ep.team_return(),
    "relative": Episode.relative_return,
}


class TrainingError(RuntimeError):
    """A run that cannot go on (bad config for the game, repeated non-finite losses, weights
    that diverged)."""


@dataclass
class StepResult:
    step: int
    metrics: dict
    episodes: list[Episode] = field(default_factory=list)


def team_agents(cfg: TeamConfig) -> list[str]:
    return [a for r in cfg.roles for a in r.instance_names()]


def check_trainable(cfg: TeamConfig) -> None:
    """Fail before any compute: a train section with something to train (a file that trains
    nothing is still a team to run, as an export is), what ``marl validate`` checks against the
    game (:func:`marl.agents.checks.team_problems`; the file's own rules held when ``cfg`` was
    built), and what this machine must have installed for it."""
    tc = cfg.train
    if tc is None:
        raise TrainingError("the config has no `train` section")
    problems = something_to_train(cfg) + team_problems(cfg)
    if problems:
        raise TrainingError("\n".join(f"{dotted(path)}: {message}" for path, message in problems))
    missing = unavailable(tc.loggers)
    if missing:
        raise TrainingError(missing)
    if tc.learner.backend == "deepspeed" and importlib.util.find_spec("deepspeed") is None:
        raise TrainingError(
            "train.learner.backend is deepspeed but DeepSpeed is not installed: "
            "pip install 'marl-teams[deepspeed]'"
        )


def check_finite(step: int, weights: dict, lr: float) -> None:
    """Stop before diverged weights are played (or checkpointed) with."""
    for role, sd in weights.items():
        bad = next((k for k, v in sd.items() if not torch.isfinite(v).all()), None)
        if bad is not None:
            raise TrainingError(
                f"step {step}: the run diverged, the update made weights of role {role!r} "
                f"non-finite ({bad}): lower train.lr (now {lr})"
            )


class Trainer:
    def __init__(
        self, cfg: TeamConfig, run: Path, resume: bool = False, runtime: Runtime | None = None
    ) -> None:
        check_trainable(cfg)
        ckpt = resume_point(run) if resume else None  # before anything is written
        self.cfg, self.tc = cfg, cfg.train
        assert self.tc is not None
        self.run_dir = run
        run.mkdir(parents=True, exist_ok=True)
        sweep_orphans(run)  # a trainer owns its run: temps now are a killed run's
        team_rollout = cfg.rollout_kind() == "team"
        env = None if team_rollout else games.make_from_config(cfg.game)
        self.seats = team_agents(cfg) if env is None else list(env.possible_agents)
        self.estimator = make_estimator(
            self.tc.advantage,
            decay=self.tc.rae_decay,
            gamma=self.tc.gamma,
            scale=self.tc.advantage_scale,
        )
        self.league = League(self.tc.league, bot_names(cfg.game.name))
        self.trainable_roles = (
            {r for roles in trainable_hosts(cfg).values() for r in roles}
            if self.tc.policies == "train"
            else set()
        )
        self.exact_eval = (
            self.tc.eval_every > 0
            and hasattr(env, "root_state")
            and cfg.roles[0].backend in TABLE_BACKENDS
        )
        self.graph = graph_strategy(cfg, team_rollout, self.tc.seed)
        self.step = self.bad_steps = 0
        self.best = BestCheckpoint(run, self.tc.checkpoint_every)
        self.runtime: Runtime = runtime or (
            RayRuntime(cfg) if self.tc.ray.enabled else LocalRuntime(cfg)
        )
        self.ckpt_metrics: dict | None = None  # the restored checkpoint's metrics line
        # the learners start their magnets at the initial policy; this keeps the schedule
        self.magnet = (
            Magnet(self.tc.magnet, self.runtime.weights())
            if self.tc.magnet.alpha > 0 and self.trainable_roles
            else None
        )
        self.step_metrics = StepMetrics.of(cfg, self.trainable_roles, self.magnet is not None)
        if ckpt is not None:
            self._restore(ckpt)
        self.rollouts = Rollouts(
            self.runtime,
            lambda s: self.graph.assign(self.plan(s), s),
            self.tc.seed,
            self.tc.asynchrony.max_staleness,
            self.tc.steps,
        )

    # ----- planning
    def plan(self, step: int) -> list[EpisodeSpec]:
        tc = self.tc
        if tc.rollout == "states":
            return plan_states(self.cfg.game.name, self.seats, tc.group_size, tc.seed, step)
        rng = random.Random(derive_seed(tc.seed, step, "plan"))
        specs = []
        for g in range(tc.groups_per_step):
            opponent = self.league.sample(rng)
            seed = derive_seed(tc.seed, step, g)
            if opponent is None:
                seating = tuple((s, ParticipantId.team(i)) for i, s in enumerate(self.seats))
            else:  # the trained agent takes seat g % 2, the opponent the other
                mine = g % len(self.seats)
                seating = tuple(
                    (s, TRAINEE if i == mine else opponent) for i, s in enumerate(self.seats)
                )
            for _ in range(tc.group_size):
                specs.append(EpisodeSpec(len(specs), seed, g, seating, opponent))
        return specs

    # ----- samples and advantages
    def _reward(self, ep: Episode, turn: Turn) -> float:
        """The game's return (scaled), plus the turn's own format reward
        (train.invalid_moves), which no other turn shares."""
        base = RETURNS[self.tc.reward](ep, turn.agent)
        return base * self.tc.reward_scales.get(turn.agent, 1.0) + turn.format_reward

    def samples(
        self, episodes: list[Episode], specs: list[EpisodeSpec]
    ) -> tuple[list[tuple[Episode, Turn]], Samples]:
        rows = [
            (ep, t)
            for ep in episodes
            for t in ep.turns
            if t.role in self.trainable_roles and (t.completion_ids or t.candidate_ids)
        ]
        group_of = {s.index: s.group for s in specs}
        tc = self.tc
        groups = [
            hash(tuple(t.prompt_ids)) if tc.group_by == "state" else group_of[ep.index]
            for ep, t in rows
        ]
        agents = [t.agent if tc.agent_key == "seat" else t.role for _, t in rows]
        return rows, Samples(
            rewards=[self._reward(ep, t) for ep, t in rows],
            groups=groups,
            agents=agents,
            # RAE's baseline is per player position in self-play (SPIRAL): the agent key
            games=[ep.game for ep, _ in rows],
            roles=agents,
            episodes=[ep.index for ep, _ in rows],
            turn_rewards=[
                t.reward * tc.reward_scales.get(t.agent, 1.0) + t.format_reward for _, t in rows
            ],
            publics=[t.public for _, t in rows],
            choices=[t.choice for _, t in rows],
            probs=[t.action_probs for _, t in rows],
        )

    def items(
        self, rows: list[tuple[Episode, Turn]], adv: Advantages
    ) -> dict[str, list[TrainItem]]:
        host_of = {role: k for k, roles in trainable_hosts(self.cfg).items() for role in roles}
        out: dict[str, list[TrainItem]] = defaultdict(list)
        for (_, t), a in zip(rows, adv.values, strict=True):
            if a == 0 and t.action_values is None:
                continue  # no signal: skip the compute
            out[host_of[t.role]].append(TrainItem.of_turn(t, float(a)))
        return dict(out)

    # ----- one step
    def train_step(self) -> StepResult:
        step = self.step + 1
        t0 = time.perf_counter()
        try:
            specs, episodes, staleness = self.rollouts.take(step)
        except (ActorPoolError, PolicyError, StaleBatchError) as exc:
            raise TrainingError(f"step {step}: rollout {exc}") from None
        self.rollouts.ahead(step)
        visited = (
            value_states(self.cfg.game.name, episodes, specs)
            if self.tc.rollout == "states"
            else None
        )
        t1 = time.perf_counter()
        rows, samples = self.samples(episodes, specs)
        adv = self.estimator(samples)
        adv.values = remove_common_mode(adv.values, samples, self.tc.common_mode)
        items = self.items(rows, adv)
        t2 = time.perf_counter()
        stats = self.runtime.update(
            items, derive_seed(self.tc.seed, step, "update"), self.tc.lr_at(step)
        )
        skipped = any(s.skipped for s in stats.values())
        topology = self.graph.update(episodes, specs)
        t3 = time.perf_counter()
        weights = self.runtime.weights()
        check_finite(step, weights, self.tc.lr_at(step))
        if self.magnet is not None and self.magnet.due(step):
            self.runtime.set_magnet(*self.magnet.move(weights))
        snap = self.league.maybe_snapshot(step, weights)
        self.runtime.publish(weights, dict(self.league.snapshots), step)
        t4 = time.perf_counter()
        self._record_league(episodes, specs)
        metrics = self.step_metrics(
            step,
            episodes,
            samples,
            adv,
            stats,
            skipped,
            {"rollout": t1 - t0, "advantage": t2 - t1, "update": t3 - t2, "sync": t4 - t3},
        )
        metrics.update(snapshot=snap, staleness=staleness)
        if visited:
            metrics["states"] = visited
        if topology:
            metrics["topology"] = topology
        if self.exact_eval and (step % self.tc.eval_every == 0 or step == self.tc.steps):
            t = time.perf_counter()
            metrics["eval"] = {"exploitability": self.runtime.exploitability()}
            metrics["seconds"]["eval"] = round(time.perf_counter() - t, 3)
        self.bad_steps = self.bad_steps + 1 if skipped else 0
        self.step = step
        return StepResult(step, metrics, episodes)

    def _record_league(self, episodes: list[Episode], specs: list[EpisodeSpec]) -> None:
        by_index = {s.index: s for s in specs}
        for ep in episodes:
            spec = by_index[ep.index]
            if spec.opponent is None:
                continue
            mine = next(s for s, p in spec.seating if p == TRAINEE)
            theirs = next(s for s, p in spec.seating if p != TRAINEE)
            self.league.record(spec.opponent, ep.returns[mine] < ep.returns[theirs])

    # ----- persistence
    def _state(self) -> dict:
        est = self.estimator
        return {
            "league": self.league.state(),
            "bad_steps": self.bad_steps,
            "rae": est.baseline if isinstance(est, RoleBaseline) else None,
            "best": self.best.record,
        }

    def checkpoint(self, metrics: dict | None = None) -> Path:
        """Save everything needed to resume, plus this step's metrics line (so a kill between
        the checkpoint and the log write loses no line)."""
        state = {**self._state(), "metrics": metrics}
        return save_checkpoint(
            self.run_dir,
            self.step,
            self.cfg,
            self.runtime.weights(),
            self.runtime.optimizer_states(),
            dict(self.league.snapshots),
            state,
            extra=self._save_extra,
        )

    def _save_extra(self, folder: Path) -> None:
        """What the checkpoint holds beside the adapters: a learned topology, the magnet."""
        self.graph.save(folder)
        if self.magnet is not None:
            self.magnet.save(folder)

    def _restore(self, path: Path) -> None:
        ck = load_checkpoint(path, self.runtime.weights())
        self.step = ck.step
        self.bad_steps = ck.state.get("bad_steps", 0)
        self.best.record = ck.state.get("best")
        self.league.load_state(ck.state["league"], ck.snapshots)
        if isinstance(self.estimator, RoleBaseline) and ck.state.get("rae"):
            self.estimator.baseline = dict(ck.state["rae"])
        self.runtime.load(ck.weights, ck.optimizer_states)
        self.runtime.publish(ck.weights, dict(self.league.snapshots), ck.step)
        self.graph.load(path)
        if self.magnet is not None:
            self.runtime.set_magnet(*self.magnet.load(path))
        # the loggers drop what they hold after the checkpoint (those steps are replayed) and
        # write its own line if the kill came before it was logged
        self.ckpt_metrics = ck.state.get("metrics")

    # ----- the loop
    def fit(self, on_step: Callable[[StepResult], None] | None = None) -> list[dict]:
        tc = self.tc
        history = []
        deadline = time.monotonic() + 60 * tc.max_minutes if tc.max_minutes else float("inf")
        budget.adopt(time.time() + 60 * tc.max_minutes if tc.max_minutes else None)  # game calls
        loggers = open_loggers(tc.loggers, self.run_dir, self.cfg, self.step, self.ckpt_metrics)
        ok = False
        try:
            if self.step == 0 and self.exact_eval:  # the curve starts at the untrained policy
                for lg in loggers:
                    lg.log({"step": 0, "eval": {"exploitability": self.runtime.exploitability()}})
            while self.step < tc.steps:
                res = self.train_step()
                stop = self.bad_steps >= tc.max_bad_steps
                last = self.step == tc.steps or time.monotonic() >= deadline
                if last and self.exact_eval and "eval" not in res.metrics:
                    # a time budget ended the run: its final policy gets its figure too
                    res.metrics["eval"] = {"exploitability": self.runtime.exploitability()}
                previous_best = self.best.improved(res.metrics, self.step)
                improved = previous_best is not None
                if not stop and (self.step % tc.checkpoint_every == 0 or last or improved):
                    t = time.perf_counter()
                    path = self.checkpoint(res.metrics)
                    if improved:
                        self.best.keep(path, previous_best)
                    res.metrics["seconds"]["checkpoint"] = round(time.perf_counter() - t, 3)
                for lg in loggers:
                    lg.log(res.metrics)
                if stop:
                    raise TrainingError(
                        f"{self.bad_steps} steps in a row had a non-finite loss or gradient "
                        f"(last at step {res.step}); lower train.lr or check the rewards"
                    )
                history.append(res.metrics)
                if on_step:
                    on_step(res)
                if last:
                    break
            ok = True
        finally:
            self.rollouts.close()
            budget.adopt(None)
            for lg in loggers:
                lg.close(ok)
        return history
