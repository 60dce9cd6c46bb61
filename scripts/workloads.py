"""Workloads several scripts build the same way: a model host, positions of random play with
their requests, a recipe with its role's model and decoding swapped, a recipe's training run in
this process.

Imports of torch and the library stay inside the functions, so a script that only starts child
processes (``bench.engines``, ``bench.kuhn_step``) does not load them itself.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from marl.agents.host import ModelHost
    from marl.agents.policy import Request
    from marl.config import TeamConfig
    from marl.config.train import TrainConfig
    from marl.games.base import TextGame

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"


def load_host(model: str, **kwargs: Any) -> ModelHost:
    """A ``ModelHost`` on the registered ``model`` (``kwargs`` go to ``load_model``)."""
    from marl.agents.host import ModelHost
    from marl.agents.models import load_model

    return ModelHost(*load_model(model, **kwargs))


def random_positions(
    game: str, n: int, seed: int, moves: int, *, seed_bound: int = 10**6, distinct: bool = False
) -> list[TextGame]:
    """``n`` positions of ``game`` after 0 to ``moves - 1`` uniformly random moves, each with an
    agent to move (seats mixed, as a rollout batch holds them); ``distinct``: no state twice."""
    from marl import games

    rng, seen, out = random.Random(seed), set(), []
    while len(out) < n:
        env = games.make(game)
        env.reset(seed=rng.randrange(seed_bound))
        for _ in range(rng.randrange(moves)):
            if env.terminations[env.agent_selection]:
                break
            env.step(rng.choice(env.legal_actions()))
        if env.terminations[env.agent_selection]:
            continue
        if distinct:
            if env.state_key() in seen:
                continue
            seen.add(env.state_key())
        out.append(env)
    return out


def choice_requests(envs: list[TextGame]) -> list[Request]:
    """The choice-mode request of the seat to move at each position (a player with no policy)."""
    from marl.agents import Agent

    agents: dict[str, Agent] = {}
    out = []
    for env in envs:
        seat = env.agent_selection
        agent = agents.setdefault(seat, Agent(seat, "player", None, mode="choice"))  # type: ignore[arg-type]
        out.append(agent.request(env, seat))
    return out


def recipe(name: str, model: str, backend: str | None = None, **decoding: Any) -> TeamConfig:
    """``configs/NAME.yaml`` with its (first and only) role on ``model`` (and ``backend``) and
    these decoding fields replaced."""
    from marl.config import load_config

    cfg = load_config(CONFIGS / f"{name}.yaml")
    role = cfg.roles[0]
    changes: dict[str, Any] = {"model": model, "decoding": role.decoding.replace(**decoding)}
    if backend is not None:
        changes["backend"] = backend
    return cfg.replace(roles=[role.replace(**changes)])


def train_here(train: TrainConfig, steps: int, **changes: Any) -> TrainConfig:
    """``train`` for ``steps`` steps in this process (no Ray, no time limit), with these fields
    replaced: how the experiments train a recipe."""
    return train.replace(
        steps=steps, max_minutes=None, ray=train.ray.replace(enabled=False), **changes
    )
