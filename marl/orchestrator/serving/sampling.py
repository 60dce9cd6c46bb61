"""A request's sampling parameters, applied to the team that answers it.

``temperature``, ``top_p``, ``max_tokens`` and ``seed`` replace the decoding settings of every
role that samples from a model (its policy holds them as the attributes
:func:`~marl.agents.builder.decoding_kwargs` sets, and ``reseed``): the request runs on a
copy of the team whose policies are copies with those settings, on the same model hosts,
adapters and engines, so nothing is loaded.  ``max_tokens`` bounds each agent's turn, and so
the answer.  A request with a seed runs on its own (a batch's samples depend on its other
rows), so the same seed and parameters give the same answer; choice ``i`` of ``n`` uses
``seed + i``.  ``stop`` cuts the team's answer before the first stop string.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass

from marl.agents.policy import Policy
from marl.orchestrator.serving.api import ChatCompletionRequest, RequestError
from marl.orchestrator.team import Team, TeamResult

#: A request parameter -> the policy attribute it sets.
ATTRIBUTES = {"temperature": "temperature", "top_p": "top_p", "max_tokens": "max_new_tokens"}


@dataclass(frozen=True)
class Sampling:
    """The sampling parameters of one team run (None: the role's own setting)."""

    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    seed: int | None = None

    @classmethod
    def of(cls, body: ChatCompletionRequest) -> Sampling:
        """The request's parameters; ``max_tokens`` and ``max_completion_tokens`` are one."""
        limit = body.max_completion_tokens or body.max_tokens
        if body.max_tokens and body.max_completion_tokens and body.max_tokens != limit:
            raise RequestError(
                400,
                "max_tokens and max_completion_tokens differ; give one of them",
                param="max_completion_tokens",
            )
        return cls(body.temperature, body.top_p, limit, body.seed)

    def choice(self, i: int) -> Sampling:
        """The parameters of choice ``i`` of ``n``: its own seed."""
        return self if self.seed is None else dataclasses.replace(self, seed=self.seed + i)

    def given(self) -> dict[str, float | int]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


def samples(policy: Policy) -> bool:
    """Whether ``policy`` samples from a model with settings a request may change."""
    return hasattr(policy, "reseed") and hasattr(policy, "temperature")


def unsupported(team: Team, sampling: Sampling) -> tuple[str, str] | None:
    """The first parameter of ``sampling`` that ``team`` cannot honour, and why; or None."""
    policies = {id(a.policy): a for a in team.agents.values() if samples(a.policy)}
    for param in sampling.given():
        if not policies:
            return param, f"no role of team {team.name!r} samples from a model"
        attribute = ATTRIBUTES.get(param)
        for agent in policies.values():
            if attribute is not None and not hasattr(agent.policy, attribute):
                return param, f"role {agent.role!r} cannot take it (its backend has no {param})"
    return None


def _resampled(policy: Policy, sampling: Sampling, seed: int) -> Policy:
    if not samples(policy):
        return policy
    out = copy.copy(policy)
    for param, value in sampling.given().items():
        if param in ATTRIBUTES:
            setattr(out, ATTRIBUTES[param], value)
    out.reseed(seed)  # type: ignore[attr-defined]
    return out


def sampled_team(team: Team, sampling: Sampling, seed: int) -> Team:
    """``team`` with every sampling policy copied under ``sampling`` (role ``k`` seeded
    ``seed + k``); the instances of a role keep sharing one policy, so they still batch."""
    policies: dict[int, Policy] = {}
    agents = []
    for agent in team.agents.values():
        if id(agent.policy) not in policies:
            policies[id(agent.policy)] = _resampled(agent.policy, sampling, seed + len(policies))
        agents.append(dataclasses.replace(agent, policy=policies[id(agent.policy)]))
    return Team(
        team.cfg,
        agents,
        team.topology,
        learnable=team.learnable,
        hosts=team.hosts,
        prompt=team.prompt,
        experts={role: expert for role, (_, expert) in team.defer.items()},
    )


def stopped(text: str, stops: list[str]) -> tuple[str, bool]:
    """``text`` cut before its first stop string, and whether one was found."""
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
    return (text, False) if cut < 0 else (text[:cut], True)


def finish_reason(result: TeamResult, sampling: Sampling, stop_found: bool) -> str:
    """``length`` when the deciding turn used all ``max_tokens``, else ``stop``."""
    if stop_found or sampling.max_tokens is None:
        return "stop"
    turn = next((t for t in result.transcript if t.node == result.decided_by), None)
    return (
        "length" if turn is not None and turn.completion_tokens >= sampling.max_tokens else "stop"
    )
