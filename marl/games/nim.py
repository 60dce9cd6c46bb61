"""Nim (normal play): take any number of objects from one pile; whoever takes the last one wins.

Solved by Bouton's rule: the player to move wins iff the XOR of the pile sizes is non-zero, so
it is the cheapest game with an exactly known optimal policy.  Piles are numbered from 1 in
the text and an action is written ``[pile 2 take 3]``; the shorthand ``[2:3]`` is accepted too.
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Sequence
from functools import reduce
from operator import xor
from typing import ClassVar

import numpy as np

from marl.games.base import InvalidAction, TextGame
from marl.games.bots import PolicyBot, register_bot
from marl.games.registry import register

_SHORTHAND = re.compile(r"\[\s*(\d+)\s*:\s*(\d+)\s*\]")


@register("nim")
class Nim(TextGame):
    """Two players alternately take 1..n objects from a single non-empty pile."""

    metadata: ClassVar[dict] = {"name": "nim", "render_modes": ["ansi"], "is_parallelizable": False}
    possible_agents: ClassVar[list[str]] = ["player_0", "player_1"]
    perfect_information: ClassVar[bool] = True

    def __init__(self, piles: Sequence[int] = (1, 3, 5, 7), **kwargs) -> None:
        if not piles or any(p < 0 for p in piles) or not any(piles):
            raise ValueError(f"piles must be non-negative with at least one object, got {piles}")
        self.initial_piles = tuple(int(p) for p in piles)
        self.max_take = max(self.initial_piles)
        self.action_names = [
            f"pile {i + 1} take {n}" for i in range(len(piles)) for n in range(1, self.max_take + 1)
        ]
        self.obs_shape = (len(piles),)
        self.rules = (
            f"Nim with {len(piles)} piles. Players take turns removing one or more objects "
            f"from a single pile. Whoever takes the last object wins (+1, the loser gets -1). "
            f"Piles are numbered 1-{len(piles)}. Answer like [pile 2 take 3] (or [2:3])."
        )
        super().__init__(**kwargs)

    def encode_action(self, pile: int, take: int) -> int:
        """Action index of taking ``take`` objects from 0-based ``pile``."""
        return pile * self.max_take + take - 1

    def decode_action(self, action: int) -> tuple[int, int]:
        """(0-based pile, number taken) of an action index."""
        pile, rest = divmod(action, self.max_take)
        return pile, rest + 1

    def _setup(self, rng: np.random.Generator) -> None:
        self.piles = list(self.initial_piles)
        self.winner: str | None = None

    def _legal(self, agent: str) -> list[int]:
        return [
            self.encode_action(i, n)
            for i, size in enumerate(self.piles)
            for n in range(1, size + 1)
        ]

    def _apply(self, agent: str, action: int) -> None:
        pile, take = self.decode_action(action)
        self.piles[pile] -= take
        if not any(self.piles):
            self.winner = agent
            self._end({agent: 1.0, self._next_agent(agent): -1.0})

    def _encode(self, agent: str) -> np.ndarray:
        return np.array(self.piles) / self.max_take

    def _describe(self, agent: str) -> str:
        piles = ", ".join(f"pile {i + 1}: {n}" for i, n in enumerate(self.piles))
        if self.winner is not None:
            status = "Game over: you won." if self.winner == agent else "Game over: you lost."
        elif all(self.terminations.values()):
            status = "Game over: forfeit."
        else:
            status = "It is your turn." if agent == self.agent_selection else "Opponent's turn."
        return f"{status} Piles: {piles}."

    def parse_action(self, agent: str, text: str) -> int | InvalidAction:
        """The base parser after rewriting the ``[2:3]`` shorthand to ``[pile 2 take 3]``."""
        if not isinstance(text, str):
            return super().parse_action(agent, text)
        parsed = super().parse_action(
            agent, _SHORTHAND.sub(lambda m: f"[pile {m[1]} take {m[2]}]", text)
        )
        return InvalidAction(text, parsed.reason) if isinstance(parsed, InvalidAction) else parsed

    def state_key(self) -> Hashable:
        return tuple(self.piles), self.agent_selection, all(self.terminations.values())


def nim_sum(piles: Sequence[int]) -> int:
    return reduce(xor, piles, 0)


@register_bot("nim", "optimal")
class OptimalNim(PolicyBot):
    """Bouton's rule: move to XOR 0; from a lost position take one from the largest pile."""

    def action_probs(self, env: Nim, agent: str) -> dict[int, float]:
        total = nim_sum(env.piles)
        for i, size in enumerate(env.piles):
            if total and size ^ total < size:
                return {env.encode_action(i, size - (size ^ total)): 1.0}
        largest = max(range(len(env.piles)), key=env.piles.__getitem__)
        return {env.encode_action(largest, 1): 1.0}


@register_bot("nim", "heuristic")
class HeuristicNim(PolicyBot):
    """Take a whole pile when it is the last one, else avoid leaving a single pile."""

    def action_probs(self, env: Nim, agent: str) -> dict[int, float]:
        nonempty = [i for i, size in enumerate(env.piles) if size]
        if len(nonempty) == 1:
            i = nonempty[0]
            return {env.encode_action(i, env.piles[i]): 1.0}
        legal = env.legal_actions(agent)
        if len(nonempty) == 2:  # emptying either pile would hand the opponent a one-pile win
            legal = [
                a for a in legal if env.piles[env.decode_action(a)[0]] != env.decode_action(a)[1]
            ] or legal
        return {a: 1.0 / len(legal) for a in legal}
