"""The metrics line of one training step (one line of ``RUN/metrics.jsonl``).

Per agent and seat the mean return and the win rate (a win: the unique best return); per
advantage key the advantages' mean and spread; over the trainable agents' decisions the parse
error, illegal move and format penalty counts and the generation speed; per learner the
update's loss, gradient norm, KL and entropy.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from marl.agents.rollout import Episode, Turn
from marl.config import TeamConfig
from marl.train.advantages import Advantages, Samples
from marl.train.learner import UpdateStats
from marl.train.topology import deferral_rate


@dataclass(frozen=True)
class StepMetrics:
    """What a run's metrics hold beyond every step's: the roles trained, the branch count
    (``train.branch``), whether roles defer, whether a magnet regularises, whether episodes
    are games (per-seat outcomes are reported only then)."""

    trainable_roles: set[str]
    branch: int
    defers: bool
    magnet: bool
    games: bool = True  # False: train.rollout states, whose episodes are single decisions

    @classmethod
    def of(cls, cfg: TeamConfig, trainable_roles: set[str], magnet: bool) -> StepMetrics:
        """The metrics of ``cfg``'s run: its branch count, deferring roles, rollout kind."""
        assert cfg.train is not None
        defers = any(r.defer is not None for r in cfg.roles)
        return cls(trainable_roles, cfg.train.branch, defers, magnet, cfg.train.rollout != "states")

    def __call__(
        self,
        step: int,
        episodes: list[Episode],
        samples: Samples,
        adv: Advantages,
        stats: dict[str, UpdateStats],
        skipped: bool,
        seconds: dict,
    ) -> dict:
        m: dict = {
            "step": step,
            "episodes": len(episodes),
            "skipped": skipped,
            "seconds": {k: round(v, 3) for k, v in seconds.items()},
            "degenerate_groups": adv.degenerate,
            "groups": adv.cells,
            "agents": agent_outcomes(episodes) if self.games else {},
            "advantage": advantage_stats(samples, adv),
        }
        turns = [t for ep in episodes for t in ep.turns if t.role in self.trainable_roles]
        m.update(decision_metrics(turns, seconds["rollout"]))
        pace = 60 * len(episodes) / max(sum(seconds.values()), 1e-9)  # the whole step's
        m["games_per_min" if self.games else "decisions_per_min"] = round(pace, 2)
        if self.branch:
            m["branches"] = self.branch * sum(len(t.action_values or ()) for t in turns)
        if self.defers:
            m["deferral_rate"] = deferral_rate(episodes)
        m["learner"] = {k: self._learner(s) for k, s in stats.items()}
        return m

    def _learner(self, s: UpdateStats) -> dict:
        """One learner's update statistics; the optional ones only where they were measured."""
        return {
            "loss": s.loss,
            "grad_norm": s.grad_norm,
            "kl": s.kl,
            "entropy": s.entropy,
            "clip_frac": s.clip_frac,
            "agent_grad_norms": s.agent_grad_norms,
            "skipped": s.skipped,
            **({} if s.mismatch is None else {"mismatch": s.mismatch}),
            **({} if s.is_weights is None else {"is_weights": s.is_weights}),
            **({"kl_to_magnet": s.kl_magnet} if self.magnet else {}),
            **({} if s.fit_residual is None else {"fit_residual": s.fit_residual}),
        }


def agent_outcomes(episodes: list[Episode]) -> dict[str, dict]:
    """Per ``name@seat``: mean return, win rate (the unique best return) and games played."""
    per_agent: dict[str, dict] = defaultdict(lambda: defaultdict(list))
    for ep in episodes:
        best = max(ep.returns.values())
        for seat, name in ep.seats.items():
            d = per_agent[f"{name}@{seat}"]
            d["reward"].append(ep.returns[seat])
            d["win"].append(
                float(ep.returns[seat] == best and sum(r == best for r in ep.returns.values()) == 1)
            )
    return {
        k: {
            "reward": float(np.mean(v["reward"])),
            "win_rate": float(np.mean(v["win"])),
            "games": len(v["reward"]),
        }
        for k, v in sorted(per_agent.items())
    }


def advantage_stats(samples: Samples, adv: Advantages) -> dict[str, dict]:
    """Mean and standard deviation of the advantages per agent key."""
    cells = defaultdict(list)
    for a, v in zip(samples.agents, adv.values, strict=True):
        cells[str(a)].append(v)
    return {
        k: {"mean": float(np.mean(v)), "std": float(np.std(v))} for k, v in sorted(cells.items())
    }


def decision_metrics(turns: list[Turn], rollout_seconds: float) -> dict:
    """Parse-error and illegal-move rates, format penalties, generated tokens per second of
    rollout (a choice turn generates only when it reasoned first), and the decision count."""
    gen_tokens = sum(
        len(t.completion_ids)
        for t in turns
        if t.candidate_ids is None or t.choice_prompt_ids is not None
    )
    return {
        "parse_error_rate": float(np.mean([not t.parsed for t in turns])) if turns else 0.0,
        "illegal_move_rate": (
            float(np.mean([t.parsed and not t.legal for t in turns])) if turns else 0.0
        ),
        "format_penalties": sum(t.format_reward != 0 for t in turns),
        "tokens_per_s": gen_tokens / max(rollout_seconds, 1e-9),
        "decisions": len(turns),
    }
