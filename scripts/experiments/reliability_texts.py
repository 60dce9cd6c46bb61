"""Files the reliability probes write: a tiny team, and a user's game that misbehaves."""

from __future__ import annotations

TEAM = """\
schema: marl-teams/v1
name: probe
roles:
  - name: player
    count: 2
    model: tiny-random
    adapter: {{r: 4, alpha: 8}}
    decoding: {{mode: choice}}
game: {game}
train:
  steps: 2
  group_size: 2
  groups_per_step: 2
  checkpoint_every: 1
  ray: {{enabled: false}}
"""

#: A two-player AEC game (each player calls 0-3; the call nearer 2 wins) and where it breaks.
ENV = """\
import sys, time
import numpy as np
from gymnasium import spaces
from pettingzoo import AECEnv

{at_import}

class Probe(AECEnv):
    metadata = {{"name": "probe", "is_parallelizable": False, "render_modes": []}}

    def __init__(self):
        super().__init__()
        self.possible_agents = ["player_0", "player_1"]

    def observation_space(self, agent):
        return spaces.Discrete(5)

    def action_space(self, agent):
        return spaces.Discrete(4)

    def observe(self, agent):
        {in_observe}
        return len(self.calls)

    def reset(self, seed=None, options=None):
        {in_reset}
        self.agents = list(self.possible_agents)
        self.calls = {{}}
        self.rewards = dict.fromkeys(self.agents, 0.0)
        self._cumulative_rewards = dict.fromkeys(self.agents, 0.0)
        self.terminations = dict.fromkeys(self.agents, False)
        self.truncations = dict.fromkeys(self.agents, False)
        self.infos = {{a: {{}} for a in self.agents}}
        self.agent_selection = self.agents[0]

    def step(self, action):
        {in_step}
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        self._clear_rewards()
        self.calls[agent] = int(action)
        if len(self.calls) == 2 and {ends}:
            a, b = (abs(self.calls[p] - 2) for p in self.possible_agents)
            win = float(np.sign(b - a))
            self.rewards = {{"player_0": win, "player_1": -win}}
            self.terminations = dict.fromkeys(self.agents, True)
        self.agent_selection = self.possible_agents[1 - self.possible_agents.index(agent)]
        self._accumulate_rewards()


def make():
    {in_factory}
    return Probe()
"""

#: case -> what it changes in ENV (a line of code at a place, or when the game ends).
ENV_CASES: dict[str, dict[str, str]] = {
    "raises at import": {"at_import": "raise ImportError('probe: broken module')"},
    "sys.exit at import": {"at_import": "sys.exit(3)"},
    "factory raises": {"in_factory": "raise ValueError('probe: no game today')"},
    "factory returns a number": {"in_factory": "return 42"},
    "reset raises": {"in_reset": "raise RuntimeError('probe: reset failed')"},
    "step raises": {"in_step": "raise RuntimeError('probe: step failed')"},
    "observe raises": {"in_observe": "raise KeyError('probe')"},
    "reset hangs": {"in_reset": "time.sleep(10**6)"},
    "step hangs": {"in_step": "time.sleep(10**6)"},
    "never ends": {"ends": "False"},
}


def user_env(case: str) -> str:
    parts = {"at_import": "", "in_observe": "pass", "in_reset": "pass", "in_step": "pass"}
    parts |= {"in_factory": "pass", "ends": "True"} | ENV_CASES[case]
    return ENV.format(**parts)


def env_team() -> str:
    return TEAM.format(game='{entry_point: "probe_env:make", call_timeout_s: 5}')  # hangs end fast
