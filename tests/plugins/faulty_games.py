"""A PettingZoo env that misbehaves on request, for the tests of user envs that fail: a call
that raises, one that sleeps, a game that never ends, ``sys.exit`` inside a call.  Tests put
this folder on PYTHONPATH and name ``faulty_games:faulty`` by ``entry_point``."""

from __future__ import annotations

import sys
import time

from gymnasium import spaces
from pettingzoo import AECEnv

CALLS: dict[str, int] = {}  # the calls to fail made in this process so far


class Faulty(AECEnv):
    """Two players call 0 or 1 in turn; ``fault`` names the call that goes wrong (``reset``,
    ``step``, ``observe``) and ``how`` it goes wrong: ``raise``, ``sleep`` (an hour), ``exit``
    (``sys.exit(3)``), from the ``after + 1``-th such call of the process on (so ``marl
    validate``'s trial game can pass); ``endless`` never ends the game."""

    metadata = {"name": "faulty", "is_parallelizable": False, "render_modes": []}

    def __init__(
        self, fault: str = "", how: str = "raise", endless: bool = False, after: int = 0
    ) -> None:
        super().__init__()
        self.fault, self.how, self.endless, self.after = fault, how, endless, after
        self.possible_agents = ["player_0", "player_1"]

    def _maybe_fail(self, call: str) -> None:
        if call != self.fault:
            return
        CALLS[call] = CALLS.get(call, 0) + 1
        if CALLS[call] <= self.after:
            return
        if self.how == "sleep":
            time.sleep(3600)
        if self.how == "exit":
            sys.exit(3)
        raise RuntimeError(f"the {call} of this env is broken")

    def observation_space(self, agent):
        return spaces.Discrete(3)

    def action_space(self, agent):
        return spaces.Discrete(2)

    def observe(self, agent):
        self._maybe_fail("observe")
        return self.calls.get(agent, 2)

    def reset(self, seed=None, options=None):
        self._maybe_fail("reset")
        self.agents = list(self.possible_agents)
        self.calls = {}
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
        self._maybe_fail("step")
        self._clear_rewards()
        self.calls[agent] = int(action)
        if len(self.calls) == 2 and not self.endless:
            self.rewards = {"player_0": 1.0, "player_1": -1.0}
            self.terminations = dict.fromkeys(self.agents, True)
        if self.endless:
            self.calls.clear()
        self.agent_selection = self.possible_agents[1 - self.possible_agents.index(agent)]
        self._accumulate_rewards()


def faulty(fault: str = "", how: str = "raise", endless: bool = False, after: int = 0) -> Faulty:
    return Faulty(fault, how, endless, after)


def not_an_env() -> int:
    return 3
