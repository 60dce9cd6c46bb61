"""Experts a role may defer a task to (``defer.expert``): frozen, outside the team.

An expert answers a deferred task in the deferring role's place, from that role's request (the
task as the role sees it) and the task itself.  ``oracle`` returns the task's reference answer:
the stand-in for a human expert in simulation, for tasks with a verifiable answer; ``human``
asks a person at the terminal (as ``marl play --human`` does); ``openai`` asks a hosted model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from marl.agents.policy import Policy, Request, Response, make_policy
from marl.config.schema import DeferConfig


class Expert(Protocol):
    """Answers deferred tasks; ``tasks[i]`` is the task of ``requests[i]`` (None: a bare
    question)."""

    def answer(self, requests: list[Request], tasks: Sequence[Any]) -> list[Response]: ...


class Oracle:
    """The reference answer of each task, as ``\\boxed{N}`` (what task scorers read)."""

    def answer(self, requests: list[Request], tasks: Sequence[Any]) -> list[Response]:
        out = []
        for task in tasks:
            if getattr(task, "answer", None) is None:
                raise ValueError(
                    "the oracle expert needs tasks with a reference answer (a "
                    "marl.games.tasks.Task); use the human or openai expert"
                )
            out.append(Response(text=f"\\boxed{{{task.answer}}}", temperature=0.0))
        return out


@dataclass
class PolicyExpert:
    """A frozen policy as an expert: it reads the deferring role's request."""

    policy: Policy

    def answer(self, requests: list[Request], tasks: Sequence[Any]) -> list[Response]:
        return self.policy.act(requests)


def _openai(cfg: DeferConfig, seed: int) -> Expert:
    ep = cfg.endpoint
    assert ep is not None and cfg.model is not None  # the schema requires them
    # greedy: an expert gives its best answer, not a sample
    return PolicyExpert(
        make_policy(
            "openai",
            base_url=ep.base_url,
            model=cfg.model,
            api_key_env=ep.api_key_env,
            temperature=0.0,
            seed=seed,
        )
    )


EXPERTS: dict[str, Callable[[DeferConfig, int], Expert]] = {
    "oracle": lambda cfg, seed: Oracle(),
    "human": lambda cfg, seed: PolicyExpert(make_policy("human")),
    "openai": _openai,
}


def make_expert(cfg: DeferConfig, seed: int = 0) -> Expert:
    """The expert ``cfg.expert`` names."""
    return EXPERTS[cfg.expert](cfg, seed)
