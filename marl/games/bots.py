"""Reference bots: uniform random for every game, plus per-game heuristic and optimal bots.

A bot is any object with ``act(env, agent) -> int`` choosing a legal action for ``agent`` in the
current state of ``env``.  Game files register their own bots with ``@register_bot``; the random
bot works for every game.  Bots that play a fixed mixed strategy also expose
``action_probs(env, agent) -> dict[int, float]`` so exact analysis can read their table policy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

import numpy as np

from marl.games.base import TextGame


@runtime_checkable
class Bot(Protocol):
    def act(self, env: TextGame, agent: str) -> int: ...


_BOTS: dict[tuple[str, str], Callable[..., Bot]] = {}


def register_bot(game: str, name: str) -> Callable:
    """``@register_bot("tic_tac_toe", "optimal")`` on a class taking ``seed`` and kwargs."""

    def deco(factory: Callable[..., Bot]) -> Callable[..., Bot]:
        _BOTS[(game, name)] = factory
        return factory

    return deco


def bot_names(game: str) -> list[str]:
    return sorted({"random"} | {n for g, n in _BOTS if g == game})


class UnknownBotError(KeyError, ValueError):
    """A bot name the game does not have (a ValueError too: it is bad input)."""

    def __str__(self) -> str:
        return str(self.args[0])


def make_bot(game: str, name: str, seed: int | None = None, **kwargs) -> Bot:
    if name == "random" and (game, name) not in _BOTS:
        return RandomBot(seed=seed)
    try:
        factory = _BOTS[(game, name)]
    except KeyError:
        raise UnknownBotError(
            f"no bot {name!r} for game {game!r}; known: {', '.join(bot_names(game))}"
        ) from None
    return factory(seed=seed, **kwargs)


class PolicyBot:
    """Base of bots defined by a mixed strategy: ``act`` samples ``action_probs``.

    Keeping the table as the single source of truth lets exact analysis (best responses,
    exploitability) read exactly what the bot plays.
    """

    def __init__(self, seed: int | None = None) -> None:
        self.rng = np.random.default_rng(seed)

    def action_probs(self, env: TextGame, agent: str) -> dict[int, float]:
        raise NotImplementedError

    def act(self, env: TextGame, agent: str) -> int:
        probs = self.action_probs(env, agent)
        actions = list(probs)
        if len(actions) == 1:
            return actions[0]
        return int(actions[self.rng.choice(len(actions), p=list(probs.values()))])


class RandomBot:
    """Uniform over legal moves."""

    def __init__(self, seed: int | None = None) -> None:
        self.rng = np.random.default_rng(seed)

    def action_probs(self, env: TextGame, agent: str) -> dict[int, float]:
        legal = env.legal_actions(agent)
        return {a: 1.0 / len(legal) for a in legal}

    def act(self, env: TextGame, agent: str) -> int:
        return int(self.rng.choice(env.legal_actions(agent)))
