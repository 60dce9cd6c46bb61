"""A masked PettingZoo env (a Dict of ``observation`` and ``action_mask``) whose observation
is any of several gymnasium spaces, for the adapter's tests (``space_games:masked``)."""

from __future__ import annotations

import numpy as np
from gymnasium import spaces
from pettingzoo import AECEnv

SPACES = {
    "discrete": lambda: spaces.Discrete(3),
    "box": lambda: spaces.Box(0, 2, (2, 2), np.float32),
    "multi_discrete": lambda: spaces.MultiDiscrete([3, 2]),
    "tuple": lambda: spaces.Tuple((spaces.Discrete(3), spaces.Box(0, 1, (2,), np.float32))),
    "dict": lambda: spaces.Dict({"calls": spaces.Discrete(3)}),
    "text": lambda: spaces.Text(8),
    "sequence": lambda: spaces.Sequence(spaces.Discrete(3)),
}


class Masked(AECEnv):
    """Two players call 0 or 1 in turn (after a 1, only 0 is legal); the higher call wins."""

    metadata = {"name": "masked", "is_parallelizable": False, "render_modes": []}

    def __init__(self, space: str = "discrete") -> None:
        super().__init__()
        self.kind = space
        self.possible_agents = ["player_0", "player_1"]
        obs = spaces.Dict(
            {"observation": SPACES[space](), "action_mask": spaces.Box(0, 1, (2,), np.int8)}
        )
        self.observation_spaces = dict.fromkeys(self.possible_agents, obs)
        self.action_spaces = dict.fromkeys(self.possible_agents, spaces.Discrete(2))

    def observation_space(self, agent):
        return self.observation_spaces[agent]

    def action_space(self, agent):
        return self.action_spaces[agent]

    def _seen(self) -> object:
        n = len(self.calls)
        return {
            "discrete": np.int64(n),
            "box": np.full((2, 2), n, np.float32),
            "multi_discrete": np.array([n, 0], np.int64),
            "tuple": (np.int64(n), np.zeros(2, np.float32)),
            "dict": {"calls": np.int64(n)},
            "text": "x" * n,
            "sequence": tuple(np.int64(c) for c in self.calls.values()),
        }[self.kind]

    def observe(self, agent):
        mask = np.array([1, int(1 not in self.calls.values())], np.int8)
        return {"observation": self._seen(), "action_mask": mask}

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
            a, b = (self.calls[p] for p in self.possible_agents)
            win = float(np.sign(a - b))
            self.rewards = {"player_0": win, "player_1": -win}
            self.terminations = dict.fromkeys(self.agents, True)
        self.agent_selection = self.possible_agents[1 - self.possible_agents.index(agent)]
        self._accumulate_rewards()


def masked(space: str = "discrete") -> Masked:
    return Masked(space)
