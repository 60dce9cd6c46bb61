"""Agents: the model registry, per-role policies (LoRA adapters on shared bases), decoding,
and the batched rollout engine.  Uses games; knows nothing of training.

``load_model(name)`` gives ``(model, tokenizer)`` from the registry (``smollm2-135m-instruct``,
``tiny-random``, a Hugging Face id or a local path); ``build_roster(team_cfg)`` turns a team's
roles into agents with one policy per role; ``make_policy(backend, ...)`` builds one policy;
``RolloutEngine`` plays many games at once, one batched ``act`` call per policy and step.
``participants.ParticipantLoader`` turns a source (bot, team file, run, checkpoint, export,
HTTP model, population) into an agent that takes a seat; ``tables`` reads an agent's table
policy and evaluates it exactly.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from marl.agents.agent import Agent
    from marl.agents.builder import Roster, build_roster
    from marl.agents.models import load_model
    from marl.agents.policy import Policy, Request, Response, make_policy
    from marl.agents.rollout import Episode, RolloutEngine, Turn

# Each name is imported on first use (PEP 562): importing ``marl.agents.checks`` or the policy
# types loads no model libraries; the backends register themselves when a policy is made.
_HOMES = {
    "Agent": "agent",
    "Episode": "rollout",
    "Policy": "policy",
    "Request": "policy",
    "Response": "policy",
    "RolloutEngine": "rollout",
    "Roster": "builder",
    "Turn": "rollout",
    "build_roster": "builder",
    "load_model": "models",
    "make_policy": "policy",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'marl.agents' has no attribute {name!r}")
    return getattr(importlib.import_module(f"marl.agents.{_HOMES[name]}"), name)


__all__ = [
    "Agent",
    "Episode",
    "Policy",
    "Request",
    "Response",
    "RolloutEngine",
    "Roster",
    "Turn",
    "build_roster",
    "load_model",
    "make_policy",
]
