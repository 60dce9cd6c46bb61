"""Two PettingZoo envs the project does not register, for the plugin tests: a turn-based
(AEC) game without an action mask and a Parallel one.  Tests put this folder on PYTHONPATH and
name the factories by ``entry_point`` (``pz_games:closest_number``)."""

from __future__ import annotations

import numpy as np
from gymnasium import spaces
from pettingzoo import AECEnv, ParallelEnv


class ClosestNumber(AECEnv):
    """Each player calls a number in turn; the call closest to ``target`` wins.  No action
    mask: every call is legal.  ``describe`` gives the text view."""

    metadata = {"name": "closest_number", "is_parallelizable": False, "render_modes": []}

    def __init__(self, target: int = 2, numbers: int = 4) -> None:
        super().__init__()
        self.target, self.numbers = target, numbers
        self.possible_agents = ["player_0", "player_1"]
        self._obs = spaces.Discrete(numbers + 1)  # the other's call, or `numbers` for none yet
        self._act = spaces.Discrete(numbers)

    def observation_space(self, agent):
        return self._obs

    def action_space(self, agent):
        return self._act

    def observe(self, agent):
        other = self.possible_agents[1 - self.possible_agents.index(agent)]
        return self.calls.get(other, self.numbers)

    def describe(self, agent):
        other = self.possible_agents[1 - self.possible_agents.index(agent)]
        said = self.calls.get(other)
        return (
            f"Call a number from 0 to {self.numbers - 1}; the call closest to "
            f"{self.target} wins. {other} "
            + ("has not called yet." if said is None else f"called {said}.")
        )

    def reset(self, seed=None, options=None):
        self.agents = list(self.possible_agents)
        self.calls: dict[str, int] = {}
        self.rewards = dict.fromkeys(self.agents, 0.0)
        self._cumulative_rewards = dict.fromkeys(self.agents, 0.0)
        self.terminations = dict.fromkeys(self.agents, False)
        self.truncations = dict.fromkeys(self.agents, False)
        self.infos = {a: {} for a in self.agents}
        self.agent_selection = self.agents[0]

    def step(self, action):
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        self._clear_rewards()
        self.calls[agent] = int(action)
        if len(self.calls) == 2:
            a, b = (abs(self.calls[p] - self.target) for p in self.possible_agents)
            win = float(np.sign(b - a))
            self.rewards = {"player_0": win, "player_1": -win}
            self.terminations = dict.fromkeys(self.agents, True)
        self.agent_selection = self.possible_agents[1 - self.possible_agents.index(agent)]
        self._accumulate_rewards()


def closest_number(target: int = 2, numbers: int = 4) -> ClosestNumber:
    return ClosestNumber(target, numbers)


class Pennies(ParallelEnv):
    """Matching pennies, both players at once, for ``rounds`` rounds; no text view of its own."""

    metadata = {"name": "pennies", "render_modes": []}
    render_mode = None

    def __init__(self, rounds: int = 1) -> None:
        self.rounds = rounds
        self.possible_agents = ["even", "odd"]

    def observation_space(self, agent):
        return spaces.Box(0, 1, (2,), np.float32)  # both last coins

    def action_space(self, agent):
        return spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        self.agents = list(self.possible_agents)
        self.round = 0
        zero = np.zeros(2, np.float32)
        return {a: zero for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        self.round += 1
        same = actions["even"] == actions["odd"]
        rewards = {"even": 1.0 if same else -1.0, "odd": -1.0 if same else 1.0}
        done = self.round >= self.rounds
        obs = {a: np.array([actions["even"], actions["odd"]], np.float32) for a in self.agents}
        flags = dict.fromkeys(self.agents, done)
        infos = {a: {} for a in self.agents}
        if done:
            self.agents = []
        return obs, rewards, flags, dict.fromkeys(flags, False), infos


def pennies(rounds: int = 1) -> Pennies:
    return Pennies(rounds)
