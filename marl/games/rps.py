"""Iterated rock-paper-scissors: the simplest simultaneous-move game (uniform Nash, value 0).

Two forms share one implementation:

- ``rps`` (AEC, turn-based): each round player_0 moves, then player_1; a move stays hidden until
  the round is complete, so neither player ever sees the other's current choice.
- ``rps`` parallel form (:class:`ParallelRockPaperScissors`, ``marl.games.make_parallel("rps")``):
  both choices in one ``step``.

Rewards are paid **per round** (+1 win, -1 loss, 0 tie) when the round resolves, so an episode's
return is wins minus losses and learners get a signal every round, not only at the end.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
from pettingzoo import ParallelEnv

from marl.games.base import TextGame
from marl.games.bots import PolicyBot, register_bot
from marl.games.registry import register, register_parallel

MOVES = ["Rock", "Paper", "Scissors"]
OUTCOME = {0: "tie", 1: "won", -1: "lost"}


def payoff(a: int, b: int) -> int:
    """+1 if move ``a`` beats ``b`` (each move beats the one before it), -1 if it loses, 0 tie."""
    return (0, 1, -1)[(a - b) % 3]


@register("rps")
class RockPaperScissors(TextGame):
    """``rounds`` rounds of rock-paper-scissors; moves are revealed when both have played."""

    metadata: ClassVar[dict] = {"name": "rps", "render_modes": ["ansi"], "is_parallelizable": True}
    possible_agents: ClassVar[list[str]] = ["player_0", "player_1"]
    action_names: ClassVar[list[str]] = MOVES
    obs_shape: ClassVar[tuple[int, ...]] = (8,)

    def __init__(self, rounds: int = 3, **kwargs) -> None:
        if rounds < 1:
            raise ValueError(f"rounds must be >= 1, got {rounds}")
        self.rounds = rounds
        self.rules = (
            f"Rock-paper-scissors, {rounds} rounds. Each round both players choose Rock, Paper "
            f"or Scissors without seeing the other's choice; Rock beats Scissors, Scissors beats "
            f"Paper, Paper beats Rock. Each round pays +1 to the winner and -1 to the loser "
            f"(0 each on a tie). Answer with [Rock], [Paper] or [Scissors]."
        )
        super().__init__(**kwargs)

    def _setup(self, rng: np.random.Generator) -> None:
        self.history: list[tuple[int, int]] = []  # completed rounds: (player_0, player_1)
        self.pending: int | None = None  # player_0's hidden move in the current round

    def _legal(self, agent: str) -> list[int]:
        return [0, 1, 2]

    def _apply(self, agent: str, action: int) -> None:
        if agent == self.possible_agents[0]:
            self.pending = action
            return
        first, second = self.possible_agents
        self.history.append((self.pending, action))
        self.pending = None
        result = payoff(*self.history[-1])
        if len(self.history) == self.rounds:
            self._end({first: result, second: -result})
        else:
            self.rewards[first], self.rewards[second] = float(result), float(-result)

    def score(self, agent: str) -> int:
        """Wins minus losses of ``agent`` over the completed rounds."""
        sign = 1 if agent == self.possible_agents[0] else -1
        return sum(sign * payoff(a, b) for a, b in self.history)

    def moves_of(self, agent: str, round_moves: tuple[int, int]) -> tuple[int, int]:
        """(own move, opponent's move) of a round."""
        own, other = round_moves
        return (own, other) if agent == self.possible_agents[0] else (other, own)

    def _encode(self, agent: str) -> np.ndarray:
        obs = np.zeros(8, dtype=np.float32)
        if self.history:
            own, other = self.moves_of(agent, self.history[-1])
            obs[own], obs[3 + other] = 1.0, 1.0
        obs[6] = len(self.history) / self.rounds
        obs[7] = 0.5 + self.score(agent) / (2 * self.rounds)
        return obs

    def _describe(self, agent: str) -> str:
        lines = []
        for i, moves in enumerate(self.history, 1):
            own, other = self.moves_of(agent, moves)
            lines.append(
                f"Round {i}: you {MOVES[own]}, opponent {MOVES[other]} "
                f"({OUTCOME[payoff(own, other)]})."
            )
        score = f"Your score (wins minus losses): {self.score(agent):+d}."
        if all(self.terminations.values()):
            status = "Game over."
        else:
            status = f"Round {len(self.history) + 1} of {self.rounds}."
            if agent == self.agent_selection:
                status += " Choose your move; your opponent cannot see it."
        return "\n".join([*lines, score, status])


@register_parallel("rps")
class ParallelRockPaperScissors(ParallelEnv):
    """Both players move in one ``step``; a thin driver over the AEC game, so the rules,
    observations and rewards are exactly those of ``rps``.  A missing or illegal action
    forfeits the game (there are no retries when moves are simultaneous)."""

    metadata: ClassVar[dict] = {"name": "rps_parallel", "render_modes": ["ansi"]}

    def __init__(
        self, rounds: int = 3, illegal_reward: float = -1.0, render_mode: str | None = None
    ) -> None:
        self.game = RockPaperScissors(
            rounds=rounds, illegal_reward=illegal_reward, render_mode=render_mode
        )
        self.possible_agents = list(self.game.possible_agents)
        self.agents: list[str] = []
        self.render_mode = render_mode

    def observation_space(self, agent: str) -> Any:
        return self.game.observation_space(agent)

    def action_space(self, agent: str) -> Any:
        return self.game.action_space(agent)

    def _observe_all(self) -> tuple[dict, dict]:
        return (
            {a: self.game.observe(a) for a in self.agents},
            {a: dict(self.game.infos[a]) for a in self.agents},
        )

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        self.game.reset(seed=seed, options=options)
        self.agents = list(self.possible_agents)
        return self._observe_all()

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        game = self.game
        if self.agents and not any(game._is_legal(a, actions.get(a)) for a in self.agents):
            return self._both_forfeit()
        rewards = {a: 0.0 for a in self.agents}
        for agent in self.agents:
            if all(game.terminations.values()):
                break  # the first player forfeited
            game.step(actions.get(agent))
            for a in self.agents:
                rewards[a] += game.rewards[a]
        over = all(game.terminations.values())
        terminations = {a: over for a in self.agents}
        truncations = {a: False for a in self.agents}
        observations, infos = self._observe_all()
        if over:
            self.agents = []
        return observations, rewards, terminations, truncations, infos

    def _both_forfeit(self) -> tuple[dict, dict, dict, dict, dict]:
        """Neither move is legal: both players lose the game, not only the one stepped first."""
        game = self.game
        for a in self.agents:
            game.infos[a]["illegal_moves"] += 1
            game.infos[a]["forfeit"] = True
        game._end({a: game.illegal_reward for a in self.agents})
        rewards = {a: game.rewards[a] for a in self.agents}
        observations, infos = self._observe_all()
        done = {a: True for a in self.agents}
        self.agents = []
        return observations, rewards, done, {a: False for a in done}, infos

    def render(self) -> str:
        return self.game.render()

    def close(self) -> None:
        self.game.close()


@register_bot("rps", "optimal")
class UniformRockPaperScissors(PolicyBot):
    """The unique Nash equilibrium: uniform, unexploitable (and unexploiting)."""

    def action_probs(self, env: TextGame, agent: str) -> dict[int, float]:
        return {a: 1.0 / 3 for a in range(3)}


@register_bot("rps", "heuristic")
class FrequencyRockPaperScissors(PolicyBot):
    """Beat the opponent's most frequent move so far (ties split evenly); uniform at first."""

    def action_probs(self, env: RockPaperScissors, agent: str) -> dict[int, float]:
        counts = [0, 0, 0]
        for moves in env.history:
            counts[env.moves_of(agent, moves)[1]] += 1
        favourite = [m for m in range(3) if counts[m] == max(counts)]
        counters = sorted({(m + 1) % 3 for m in favourite})
        return {a: 1.0 / len(counters) for a in counters}
